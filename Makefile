# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# Both create .venv with Python >= 3.12 and install pinned versions from constraints.txt.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

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

.PHONY: venv run test lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || { py=$$($(find_python)) && echo "creating $(VENV) with $$py" && "$$py" -m venv $(VENV); }
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed

run: venv
	@echo "datarax mesh service on http://$(HOST):$(PORT)  (docs: http://$(HOST):$(PORT)/docs)"
	$(VENV)/bin/datarax-serve --host $(HOST) --port $(PORT)

test: venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check datarax app tests benchmarks
	$(VENV)/bin/ruff format --check datarax app tests benchmarks

bench: venv
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) var .pytest_cache
