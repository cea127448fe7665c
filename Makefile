# Two commands do all set-up on a fresh machine (see README):
#   make demo   - create .venv, install fedveil, run the main job (examples/quickstart.toml)
#   make test   - create .venv, install fedveil with test extras, run the test suite
# torch is installed first, from PyTorch's CPU wheel index by default, so that pip never
# pulls a CUDA build (PyPI's Linux torch wheel is one) on a CPU machine; fedveil's own
# install then keeps it. On a GPU machine use `make demo TORCH=torch` (any other TORCH
# skips the CPU index: pip installs PyPI's CUDA build); `make clean` first to replace a
# CPU torch already in .venv. Offline (a local wheel mirror only) the CPU index fails
# fast (one retry) and the local CPU wheel is used.
PYTHON      ?= python3
VENV        ?= .venv
TORCH_CPU   := torch==2.13.0
TORCH       ?= $(TORCH_CPU)
TORCH_INDEX ?= $(if $(filter $(TORCH_CPU),$(TORCH)),https://download.pytorch.org/whl/cpu)
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-slow install install-dev clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --retries 1 --timeout 20) "$(TORCH)"
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
