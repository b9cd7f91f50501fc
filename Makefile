# The two commands of README.md. Both set up everything they need first.
PYTHON ?= python3
REPORTS ?= reports
COMPILE_TARGETS ?= sm_80,sm_90,sm_100,gfx90a,gfx942,gfx950
# The oldest supported Triton (what the GPU image has); its compile matrix runs in a side venv.
PREVIOUS_TRITON ?= 3.6.0
PREVIOUS_VENV ?= .venv-triton-$(PREVIOUS_TRITON)

.PHONY: setup demo test compile-matrix compile-matrix-previous

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

demo: setup
	$(PYTHON) -m spec_hal.cli demo

# The project's tests (they run the conformance suite on every backend this machine has), then
# every Triton kernel compiled offline for the six GPU targets.
test: setup
	SPEC_HAL_REPORT_DIR=$(REPORTS) $(PYTHON) -m pytest tests -v -rs --durations=15
	$(MAKE) --no-print-directory compile-matrix

compile-matrix: setup
	mkdir -p $(REPORTS)
	$(PYTHON) -m spec_hal.cli compile-matrix --targets $(COMPILE_TARGETS) --known-issues ci/xfail/compile-matrix.toml \
		--json $(REPORTS)/compile-matrix.json --markdown $(REPORTS)/compile-matrix.md

compile-matrix-previous: setup
	test -x $(PREVIOUS_VENV)/bin/python || $(PYTHON) -m venv --system-site-packages $(PREVIOUS_VENV)
	$(PREVIOUS_VENV)/bin/python -c "import triton, sys; sys.exit(triton.__version__ != '$(PREVIOUS_TRITON)')" \
		|| $(PREVIOUS_VENV)/bin/python -m pip install --quiet "triton==$(PREVIOUS_TRITON)"
	$(PREVIOUS_VENV)/bin/python -m pip install --quiet --no-deps -e .
	mkdir -p $(REPORTS)
	$(PREVIOUS_VENV)/bin/python -m spec_hal.cli compile-matrix --targets $(COMPILE_TARGETS) \
		--known-issues ci/xfail/compile-matrix.toml \
		--json $(REPORTS)/compile-matrix-triton-$(PREVIOUS_TRITON).json \
		--markdown $(REPORTS)/compile-matrix-triton-$(PREVIOUS_TRITON).md
