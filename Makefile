# One entry point for people and CI. Build outputs live in $(HYBRIDSERVING_CACHE), outside git.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
export HYBRIDSERVING_CACHE ?= $(HOME)/.cache/hybridserving
# Absolute, so the cache's paths mean the same from every working directory.
override HYBRIDSERVING_CACHE := $(abspath $(HYBRIDSERVING_CACHE))

.DELETE_ON_ERROR:

.PHONY: setup tools lint-tools sglang-parser test unit tooling integration e2e crds verify lint demo bench clean-cluster

# The venv is built by uv (pinned, fetched once into the cache): it resolves and downloads in
# parallel, so a fresh clone has its venv in seconds where pip took minutes. `--seed` keeps pip
# in the venv for those who use it.
UV_VERSION := 0.13.9
UV_HOME := $(HYBRIDSERVING_CACHE)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv

# --upgrade: pip refuses to fill a --target whose bin/ an interrupted install left behind.
$(UV):
	$(PY) -m pip install -q --disable-pip-version-check --upgrade --target $(UV_HOME) uv==$(UV_VERSION)

# The stamp is a file of the venv's own: bin/python is a link to the base interpreter, and touching
# it would date (or fail on, when another user owns it) the interpreter itself.
VENV_STAMP := $(VENV)/.installed
$(VENV_STAMP): pyproject.toml | $(UV)
	$(UV) venv -q --seed --allow-existing --python "$$($(PY) -c 'import sys; print(sys.executable)')" $(VENV)
	VIRTUAL_ENV=$(VENV) $(UV) pip install -q -e '.[test]'
	touch $@

setup: $(VENV_STAMP)

tools:
	bash tools/build-tools.sh

lint-tools:
	bash tools/lint-tools.sh

sglang-parser:
	bash tools/sglang-parser.sh

# Generated files: the CRDs come from the pydantic models.
crds: setup
	$(VPY) -m hybridserving.api.crd

verify: setup
	$(VPY) -m hybridserving.api.crd --check
	$(VENV)/bin/lint-imports

# Style and types (settings in pyproject.toml), then the layering and CRD drift checks.
lint: setup
	$(VENV)/bin/ruff check operator engine tests benchmarks tools
	$(VENV)/bin/mypy
	$(MAKE) verify

# Pure, fast tests: nothing to build beyond the venv. Whole-scenario tests marked `slow` run in
# `make test`.
unit: setup
	$(VPY) -m pytest tests/unit -q -m "not slow" -n auto

# Tests that run a built tool on the repository: helm template, promtool, hadolint, SGLang's own parser.
tooling: setup tools lint-tools sglang-parser
	$(VPY) -m pytest tests/tooling -q

integration: setup tools
	$(VPY) -m pytest tests/integration -q

e2e: setup tools
	$(VPY) -m pytest tests/e2e -q

# The README's test command: installs and builds what is missing, runs `make lint`, then every
# suite (unit, tooling, integration, e2e).
test: setup tools lint-tools sglang-parser lint
	$(VPY) -m pytest tests -q

# Every benchmark prints its figures; CI runs them after the tests.
bench: setup tools
	$(VPY) benchmarks/bench_transfer_plan.py
	$(VPY) benchmarks/bench_engine_simulator.py
	$(VPY) benchmarks/bench_operator.py
	# CI runs the agentic workload (about 40 s); mix-shift, diurnal and Mooncake take far longer
	# on 2 cores: `$(VPY) benchmarks/bench_role_switch.py --out out/bench` runs them all.
	$(VPY) benchmarks/bench_role_switch.py --quick --workloads agentic --policies ours --no-scaling --out out/bench

# The README's main job: local control plane, operator, a fleet on the SGLang simulator, the real
# router, traffic whose mix shifts, and a role switch.
demo: setup tools
	$(VPY) -m hybridserving.demo

clean-cluster:
	-$(VPY) -m hybridserving.devcluster down --all
