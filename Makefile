# linkwise: the two commands are `make demo` (the main job end to end on the embedded
# default workload) and `make test` (lint, types and the whole test suite). Both install
# everything they need into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= linkwise-out
# The local Slurm's version (scripts/local-slurm): 22.05 (Debian 12's packages on the host),
# 24.11 or 26.05 (Debian trixie's / forky's in a cached chroot). Exported: tests that start
# their own instances through the script inherit it.
LINKWISE_SLURM_VERSION ?= 24.11
export LINKWISE_SLURM_VERSION

.PHONY: install demo demo-slurm test lint format typecheck pytest bench clean slurm-up slurm-down prometheus-up prometheus-down

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The whole pipeline on the embedded default workload, no Slurm and no servers needed.
demo: install
	$(BIN)/linkwise demo --out $(DEMO_OUT)/demo

# The same pipeline with the history collected from the real local Slurm (root only).
demo-slurm: install
	scripts/local-slurm start
	$(BIN)/python -c 'from linkwise.pipelines.demo_slurm import run_demo_slurm; run_demo_slurm("$(DEMO_OUT)/demo-slurm")'; \
	rc=$$?; scripts/local-slurm stop; exit $$rc

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install
	$(BIN)/mypy -p linkwise

# Tests marked `services` need a real Slurm and a real Prometheus: the project's own scripts
# install and start them (scripts/local-slurm, scripts/local-prometheus), and they are stopped
# again whatever the outcome. Two pytest-xdist workers, one scope per module except the modules
# with `services` tests: those are one scope, so they never run beside each other
# (tests/conftest.py, SERVICES_MODULES). PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
pytest: install
	scripts/local-slurm start
	scripts/local-prometheus start
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=30; \
	rc=$$?; scripts/local-prometheus stop; scripts/local-slurm stop; exit $$rc

slurm-up:
	scripts/local-slurm start

slurm-down:
	scripts/local-slurm stop

prometheus-up:
	scripts/local-prometheus start

prometheus-down:
	scripts/local-prometheus stop

test: lint typecheck pytest

bench: install
	$(BIN)/python benchmarks/simulator_speed.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .mypy_cache .pytest_cache .ruff_cache
