# Two entry points: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
VENV ?= .venv

SHELL := /bin/bash
LLAMA_CPP := $(shell grep -o 'llama-cpp-python\[server\][^"]*' pyproject.toml)
LLAMA_VER := $(patsubst llama-cpp-python[server]==%,%,$(LLAMA_CPP))
LLAMA_WHEELS ?= $(HOME)/.cache/gpuflow/llama-cpp-python-portable

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	@# llama-cpp-python (the demo's real model): built once per machine as a portable x86-64/AVX2 wheel
	@# (GGML_NATIVE=OFF) and kept in $(LLAMA_WHEELS). A native build takes every instruction the CPU
	@# lists, AMX included, which a VM may not enable: the server then dies of SIGILL on its first request.
	@# LLAVA_BUILD=OFF: no multimodal library (mtmd), which llama_cpp loads only for image chat formats,
	@# never for the text models gpuflow serves: 140 compile steps instead of 193, about a minute of CI.
	@$(VENV)/bin/python -c 'import llama_cpp' 2>/dev/null || { \
	  set -o pipefail; \
	  ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VER)-*.whl >/dev/null 2>&1 || { \
	    echo "building llama-cpp-python $(LLAMA_VER) (portable, once per machine, into $(LLAMA_WHEELS)):"; \
	    echo "pip compiles llama.cpp, which takes a few minutes; the compiler's progress follows"; \
	    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF $(CMAKE_ARGS)" $(VENV)/bin/pip wheel -v --no-cache-dir --no-deps \
	      -w $(LLAMA_WHEELS).tmp 'llama-cpp-python==$(LLAMA_VER)' 2>&1 \
	      | awk '/^ *\[ *[0-9]+(%|\/[0-9]+)\]|Building wheel|Successfully|[Ee]rror/ {print; fflush()}' \
	      && mkdir -p $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).tmp/llama_cpp_python-*.whl $(LLAMA_WHEELS)/; }; \
	  $(VENV)/bin/pip install --quiet "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VER)-*.whl | head -1)[server]"; }
	@# PYTHONWARNINGS: setuptools' editable install warns, in a banner, of folders named like the package
	@# (a UserWarning from the build backend, which pip passes on even with --quiet); nothing to act on here
	PYTHONWARNINGS=ignore::UserWarning $(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@
	@echo
	@echo "installed: gpuflow and temporal are in $(VENV)/bin. To type them as the README does, run once per shell:"
	@echo "  export PATH=\"$(abspath $(VENV))/bin:\$$PATH\""

.PHONY: chromium demo dry-run docs docs-serve test bench bench-control-plane bench-gateway bench-fleet bench-autoscaler bench-routing bench-console bench-pd bench-claims
# The main job: the embedded stack (Temporal dev server, control plane, simulated hosts) and a
# demo; it stays up for the Temporal UI until Ctrl-C, which stops every process it started.
demo: $(VENV)/.installed
	$(VENV)/bin/gpuflow dev --demo $(DEMO_ARGS)

dry-run: $(VENV)/.installed
	$(VENV)/bin/gpuflow dry-run

# Two pytest workers, a test file each at a time (pytest-xdist): most live tests wait on timers
# and processes, so two run side by side in about 55% of the time one after the other takes.
# The console's browser tests drive Debian's chromium through Playwright (a test dependency): the
# pip package's own browser download cannot work on these machines. Installed here where missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium (the console's browser tests)"; \
	  $(SUDO) apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium >/dev/null; }; }

# --durations: the slowest tests, named at the end of every run (the whole run must stay within CI's 40 minutes)
test: $(VENV)/.installed chromium
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=25

# The documentation site (mkdocs.yml, docs/): built strictly into site/; its Reference pages are
# generated from the code at build time (docs/hooks.py). docs-serve rebuilds as you edit.
# NO_MKDOCS_2_WARNING: Material prints a banner about its successor at every build; nothing to act on here
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_decide.py

bench-control-plane: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_control_plane.py

bench-gateway: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_gateway.py

bench-fleet: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_schedule_cli.py
	$(VENV)/bin/python bench/bench_fleet.py

bench-autoscaler: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_autoscaler.py

# Cache-aware routing against a pinned ideal, least-outstanding and SGLang's rule, through real gateways
# in front of stand-in engines with a prefix cache, on four workloads (about 11 minutes).
bench-routing: $(VENV)/.installed $(VENV)/inference-perf/.installed
	$(VENV)/bin/python bench/bench_routing.py $(BENCH_ARGS)

# inference-perf (bench-routing's inference-perf workload; pyproject.toml's bench extra) in a venv of its
# own: it needs Python >= 3.12 (the first found: IP_PY) and pins its own transformers. Without such a
# Python the bench skips that workload and says why.
IP_PY ?= $(shell for p in python3.13 python3.12 $(HOME)/.pyenv/versions/3.1[23]*/bin/python3; do \
  $$p -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)
INFERENCE_PERF := $(shell grep -o "inference-perf==[0-9.]*" pyproject.toml)
$(VENV)/inference-perf/.installed: pyproject.toml
	@if [ -z "$(IP_PY)" ]; then echo "no Python >= 3.12 here: bench-routing skips its inference-perf workload"; else \
	  $(IP_PY) -m venv $(VENV)/inference-perf && $(VENV)/inference-perf/bin/pip install --quiet '$(INFERENCE_PERF)' \
	  && touch $@; fi

# The web console's pages at 100 hosts and 1,000 replicas: each page's data time against the 300 ms
# target (a store filled as the control plane writes it, a real gateway over it; about 20 s).
bench-console: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_console.py $(BENCH_ARGS)

# Prefill/decode disaggregation against aggregated serving on the same simulated GPUs (2 and 4:
# aggregated, 1P1D, 1P3D, 2P2D, 3P1D) through a real gateway, long prompts streamed (about 5 minutes).
bench-pd: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_pd.py $(BENCH_ARGS)

# Learned memory claims (issue 42): 100 simulated hosts, deployments whose use differs from their
# estimates, placed under mode advise and mode apply; replicas, VRAM booked vs used, OOMs (under a minute).
bench-claims: $(VENV)/.installed
	$(VENV)/bin/python bench/bench_claims.py $(BENCH_ARGS)
