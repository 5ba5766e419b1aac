# Two entry points: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
VENV ?= .venv

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

.PHONY: demo dry-run test bench bench-control-plane bench-fleet
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

bench-fleet: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_schedule_cli.py
	$(VENV)/bin/python bench/bench_fleet.py
