# One entry point for people and CI. Build outputs live in $(HYBRIDSERVING_CACHE), outside git.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
export HYBRIDSERVING_CACHE ?= $(HOME)/.cache/hybridserving

.PHONY: setup tools lint-tools sglang-parser test unit tooling integration e2e crds verify lint demo bench clean-cluster

# The venv's bundled pip installs editable pyproject projects; upgrading it first only costs a
# download. Wheels come from pip's cache when it is warm.
$(VPY): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(VPY)

setup: $(VPY)

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
	$(VPY) -m pytest tests/unit -q -m "not slow"

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
