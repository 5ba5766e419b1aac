# Two entry points: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
VENV ?= .venv

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

.PHONY: demo test bench
demo: $(VENV)/.installed
	$(VENV)/bin/gpuflow demo

test: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/python -m pytest

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_decide.py
