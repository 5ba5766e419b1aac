# Two entry points: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
VENV ?= .venv

SHELL := /bin/bash
LLAMA_CPP := $(shell grep -o 'llama-cpp-python\[server\][^"]*' pyproject.toml)

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	@# llama-cpp-python (the demo's real model) compiles llama.cpp where no wheel is cached: say so, show progress
	@$(VENV)/bin/python -c 'import llama_cpp' 2>/dev/null || { \
	  echo "installing $(LLAMA_CPP): on a fresh machine pip compiles llama.cpp, which takes a few minutes;"; \
	  echo "the compiler's progress follows"; \
	  set -o pipefail; $(VENV)/bin/pip install -v '$(LLAMA_CPP)' 2>&1 \
	    | awk '/^ *\[ *[0-9]+(%|\/[0-9]+)\]|Building wheel|Successfully|[Ee]rror/ {print; fflush()}'; }
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

.PHONY: demo dry-run test bench bench-control-plane bench-gateway bench-fleet
# The main job: the embedded stack (Temporal dev server, control plane, simulated hosts) and a
# demo; it stays up for the Temporal UI until Ctrl-C, which stops every process it started.
demo: $(VENV)/.installed
	$(VENV)/bin/gpuflow dev --demo $(DEMO_ARGS)

dry-run: $(VENV)/.installed
	$(VENV)/bin/gpuflow demo

test: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/python -m pytest

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_decide.py

bench-control-plane: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_control_plane.py

bench-gateway: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_gateway.py

bench-fleet: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_schedule_cli.py
	$(VENV)/bin/python bench/bench_fleet.py
