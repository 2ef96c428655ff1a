# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

# torch is installed first and pinned: on CPU machines 2.13.0 is a local CPU
# wheel, and with it present pip does not fetch the CUDA build for `torch>=2.11`.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,dask]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpusim demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
