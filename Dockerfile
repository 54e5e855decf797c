# datarax mesh service: python:3.12-slim, pinned dependencies first, then the project.
#   docker build -t datarax-mesh .
#   docker run -p 8000:8000 -v datarax-data:/data datarax-mesh
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DATARAX_DB=/data/datarax.sqlite \
    DATARAX_PORT=8000

WORKDIR /srv

# Dependencies first: this layer is reused until pyproject.toml or constraints.txt change.
# The project's requirements come from pyproject.toml, pinned by constraints.txt.
# (README.m[d]: pyproject names the readme; the glob keeps the build working without one.)
COPY pyproject.toml constraints.txt README.m[d] ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt

# The project itself, against the same pins (nothing is resolved anew).
COPY datarax ./datarax
COPY app ./app
RUN pip install --no-deps -c constraints.txt . \
    && useradd --system --uid 10001 --home-dir /srv --shell /usr/sbin/nologin datarax \
    && mkdir -p /data \
    && chown datarax /data

USER datarax
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('DATARAX_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/health/live', timeout=4).status == 200 else 1)"]

CMD ["datarax-serve", "--host", "0.0.0.0"]
