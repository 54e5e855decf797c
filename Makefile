# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# Both create .venv with Python >= 3.12 and install pinned versions from constraints.txt,
# with the JAX wheels for this host's accelerator:
#   ACCEL=cuda  when `nvidia-smi -L` lists a GPU          (jax[cuda12]; CUDA=13 for jax[cuda13])
#   ACCEL=tpu   on a TPU VM: a Google PCI device (vendor 0x1ae0) of class "processing
#               accelerator" (0x12xxxx), which is how TPU chips show up; /dev/accel0 too
#   ACCEL=cpu   otherwise
# Set ACCEL=cpu|cuda|tpu to override. The venv remembers its variant in a stamp
# (.venv/.installed-<variant>); asking for another variant removes the old accelerator
# plugins and installs the new one. `make run` and `make test` add libtpu (the `tpu` extra)
# on every host: compile checks and the TPU topology tests build real TPU topologies with
# it, also on CPU-only hosts.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
CUDA ?= 12

define detect_accel
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then echo cuda; exit 0; fi; \
if [ -e /dev/accel0 ]; then echo tpu; exit 0; fi; \
for d in /sys/bus/pci/devices/*; do \
  if [ "$$(cat $$d/vendor 2>/dev/null)" = 0x1ae0 ]; then \
    case "$$(cat $$d/class 2>/dev/null)" in 0x12*) echo tpu; exit 0;; esac; fi; \
done; echo cpu
endef
ACCEL ?= $(shell $(detect_accel))

ifeq ($(ACCEL),cpu)
  VARIANT := cpu
  EXTRAS := dev
else ifeq ($(ACCEL),cuda)
  ifeq ($(filter $(CUDA),12 13),)
    $(error CUDA=$(CUDA): use CUDA=12 (driver >= 525) or CUDA=13 (driver >= 580))
  endif
  VARIANT := cuda$(CUDA)
  EXTRAS := dev,cuda$(CUDA)
else ifeq ($(ACCEL),tpu)
  VARIANT := tpu
  EXTRAS := dev,tpu
else
  $(error ACCEL=$(ACCEL): use ACCEL=cpu, ACCEL=cuda or ACCEL=tpu)
endif

STAMP := $(VENV)/.installed-$(VARIANT)
TEST_STAMP := $(VENV)/.installed-$(VARIANT)-test
# Packages that make one variant differ from another; removed when the variant changes.
ACCEL_PACKAGES := jax-cuda12-plugin jax-cuda12-pjrt jax-cuda13-plugin jax-cuda13-pjrt libtpu
PIP := $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt

# python3 may be 3.11 and `python3.12` may be a pyenv shim that refuses to run:
# try each candidate and keep the first that really is >= 3.12.
define find_python
for p in $${PYTHON:-} python3.12 python3.13 /usr/local/bin/python3.12 /usr/bin/python3.12 \
         $$HOME/.pyenv/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
         $$HOME/.pyenv/versions/3.13*/bin/python3.13 python3; do \
  if [ -n "$$p" ] && "$$p" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' 2>/dev/null; then \
    echo "$$p"; exit 0; fi; \
done; echo "no Python >= 3.12 found; set PYTHON=/path/to/python3.12" >&2; exit 1
endef

.PHONY: venv run test test-tools lint bench clean accel maxtext

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || { py=$$($(find_python)) && echo "creating $(VENV) with $$py" && "$$py" -m venv $(VENV); }
	@rm -f $(VENV)/.installed  # the stamp of Makefiles before variants (always CPU)
	@others=$$(ls $(VENV)/.installed-* 2>/dev/null | grep -vx -e '$(STAMP)' -e '$(TEST_STAMP)'); \
	if [ -n "$$others" ]; then \
	  echo "switching $(VENV) to $(VARIANT) (was: $$(echo $$others | xargs -n1 basename | tr "\n" " "))"; \
	  $(PY) -m pip uninstall -q -y $(ACCEL_PACKAGES) 2>&1 | grep -v 'not installed' || true; \
	  rm -f $$others $(TEST_STAMP); \
	fi
	@echo "installing the $(VARIANT) variant into $(VENV): .[$(EXTRAS)]"
	$(PIP) -e '.[$(EXTRAS)]'
	@touch $@

# The test suite's extra: libtpu (already there on the tpu variant).
$(TEST_STAMP): $(STAMP)
	$(PIP) -e '.[$(EXTRAS),tpu]'
	@touch $@

venv: $(STAMP)

# MaxText's compile path, for compile checks with "program": "maxtext": the 35 packages of
# requirements-maxtext.txt (maxtext 0.2.5 and what its train_compile imports), --no-deps,
# into $(MAXTEXT_SITE), apart from the venv's site-packages (the compile process puts it
# first on PYTHONPATH). ~470 MB; ~30 s from PyPI on 2 cores; nothing once current.
MAXTEXT_SITE := $(VENV)/maxtext
MAXTEXT_STAMP := $(MAXTEXT_SITE)/.installed
$(MAXTEXT_STAMP): requirements-maxtext.txt | $(STAMP)
	@echo "installing MaxText's compile path into $(MAXTEXT_SITE) (requirements-maxtext.txt, --no-deps)"
	@rm -rf $(MAXTEXT_SITE)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --target $(MAXTEXT_SITE) \
	  -r requirements-maxtext.txt
	@touch $@

maxtext: $(MAXTEXT_STAMP)

accel:
	@echo "ACCEL=$(ACCEL) VARIANT=$(VARIANT) extras=[$(EXTRAS)]" \
	  "venv=$$(ls $(VENV)/.installed-* 2>/dev/null | xargs -rn1 basename | tr '\n' ' ')"

# ACCEL doubles as the runtime's JAX platform (cpu, cuda, tpu): a GPU host whose CUDA
# fails to start refuses to serve instead of serving simulated CPU devices.
# The README's examples need libtpu (compile checks' TPU targets): `make run` installs it too.
run: $(TEST_STAMP) $(MAXTEXT_STAMP)
	@echo "datarax mesh service on http://$(HOST):$(PORT)  (docs: http://$(HOST):$(PORT)/docs)"
	DATARAX_PLATFORMS=$${DATARAX_PLATFORMS:-$(ACCEL)} \
	  $(VENV)/bin/datarax-serve --host $(HOST) --port $(PORT)

# Two tests need Debian packages: the dashboard's browser tests Chromium, the sbatch test
# shellcheck. Where one is missing and this user can install it (root and apt-get), `make test`
# installs it, saying so in one line (apt's output goes to $(VENV)/apt-install.log); otherwise
# those tests skip, each with one line that says how to get them (with CI=true they fail).
# DATARAX_NO_APT=1 never installs.
CHROMIUM ?= $${DATARAX_CHROMIUM:-/usr/bin/chromium}
test-tools: $(TEST_STAMP)
	@missing=""; \
	[ -x "$(CHROMIUM)" ] || missing="chromium"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } \
	  || missing="$$missing postgresql"; \
	missing=$$(echo $$missing); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$${DATARAX_NO_APT:-}" != 1 ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $$missing for the browser, sbatch and shared-store tests (apt-get install -y $$missing; log: $(VENV)/apt-install.log)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; } \
	    >$(VENV)/apt-install.log 2>&1 \
	    || echo "could not install $$missing (see $(VENV)/apt-install.log): the tests that need it skip"; \
	else \
	  echo "$$missing not installed: the tests that need it skip (to run them: sudo apt-get install -y $$missing)"; \
	fi

# The suite runs on TEST_WORKERS pytest-xdist workers (default: one per core, at most 8, each
# holds a few hundred MB to 2 GB), one test module per worker at a time, the longest modules
# first (tests/conftest.py). The suite is CPU-bound, so more workers than cores buy nothing:
# fresh clones on 2 cores took 22 min 28 s and 2,402 CPU-s with 3 workers, 19 min 17 s and
# 2,016, then 23 min 20 s and 2,444 with 2 (this VM's noise is as large as the difference),
# and with 3 the libtpu compiles once crowded a service test past its response-time limit.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 8 ? n : 8 )))
test: $(TEST_STAMP) test-tools $(MAXTEXT_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: venv
	$(VENV)/bin/ruff check datarax app tests benchmarks
	$(VENV)/bin/ruff format --check datarax app tests benchmarks
	$(VENV)/bin/mypy datarax app

bench: venv
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) var .pytest_cache
