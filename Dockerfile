# datarax mesh service: pinned dependencies first, then the project; one file for every
# accelerator (build argument ACCEL, which is also the runtime's JAX platform):
#   docker build -t datarax-mesh .                                  # CPU (default)
#   docker build --build-arg ACCEL=cuda -t datarax-mesh:cuda .      # NVIDIA GPU, jax[cuda12]
#   docker build --build-arg ACCEL=cuda --build-arg CUDA=13 ...     # jax[cuda13], driver >= 580
#   docker build --build-arg ACCEL=tpu -t datarax-mesh:tpu .        # TPU VM, jax[tpu]
#   docker run -p 8000:8000 -v datarax-data:/data datarax-mesh
#   docker run --gpus all -p 8000:8000 -v datarax-data:/data datarax-mesh:cuda
# The CUDA libraries come as wheels (jax[cuda12] pulls nvidia-*-cu12), so the base stays
# python slim: the host needs only the NVIDIA driver and the NVIDIA container toolkit.
# The base is pinned by exact tag; to pin by digest as well, resolve it once with
# `docker buildx imagetools inspect python:3.12.12-slim-bookworm` and append @sha256:...
FROM python:3.12.12-slim-bookworm

ARG ACCEL=cpu
ARG CUDA=12

# DATARAX_PLATFORMS=$ACCEL: an image built for CUDA run without a GPU refuses to serve
# rather than simulate CPU devices next to nothing.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DATARAX_DB=/data/datarax.sqlite \
    DATARAX_PORT=8000 \
    DATARAX_PLATFORMS=${ACCEL}

# tini is PID 1: it forwards signals to the HTTP process and reaps the runtime process
# that the service starts (and any child JAX leaves behind).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv

# Dependencies first: this layer is reused until pyproject.toml or constraints.txt change.
# The requirements are pyproject's dependencies plus the accelerator's extra, pinned by
# constraints.txt. (README.m[d]: pyproject names the readme; the glob keeps the build
# working without one.) tests/test_install.py runs this program and resolves its output.
COPY pyproject.toml constraints.txt README.m[d] ./
RUN ACCEL="${ACCEL}" CUDA="${CUDA}" python -c "import os, sys, tomllib; project = tomllib.load(open('pyproject.toml', 'rb'))['project']; accel = os.environ['ACCEL']; extras = {'cpu': [], 'cuda': ['cuda' + os.environ['CUDA']], 'tpu': ['tpu']}; accel in extras or sys.exit(f'ACCEL={accel!r}: use cpu, cuda or tpu'); print('\n'.join(project['dependencies'] + [r for e in extras[accel] for r in project['optional-dependencies'][e]]))" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself, against the same pins (nothing is resolved anew).
COPY datarax ./datarax
COPY app ./app
RUN pip install --no-deps -c constraints.txt . \
    && groupadd --system --gid 10001 datarax \
    && useradd --system --uid 10001 --gid 10001 --home-dir /srv --shell /usr/sbin/nologin datarax \
    && mkdir -p /data \
    && chown 10001:10001 /data

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000

# Readiness, not liveness: healthy once the device runtime is up and the store is open.
# The start period covers the first JAX start (a GPU's CUDA initialisation included).
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('DATARAX_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/health/ready', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["datarax-serve", "--host", "0.0.0.0"]
