# Two commands do all set-up on a fresh machine (see README):
#   make demo   - create .venv, install fedveil, run the main job (examples/quickstart.toml)
#   make test   - create .venv, install fedveil with test extras, run the test suite
# TORCH pins the CPU wheel first so that pip never pulls a CUDA build on a CPU machine;
# on a GPU machine use e.g. `make demo TORCH=torch`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-slow install install-dev clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH)"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.torch pyproject.toml
	$(PIP) -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/fedveil run examples/quickstart.toml

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n 2

test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n 2 -m slow

clean:
	rm -rf $(VENV) runs
