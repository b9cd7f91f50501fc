# The commands of README.md. Each sets up what it needs first (scripts/setup.sh): the active
# virtual environment, else a .venv it creates here; nothing is installed into the machine's python.
PYTHON ?= python3
VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
REPORTS ?= reports
COMPILE_TARGETS ?= sm_80,sm_90,sm_100,gfx90a,gfx942,gfx950
# Of those, the ones `make test` compiles at one launch configuration per kernel (a build check).
# sm_90 (the GPU image's) and gfx942 (the MI300 lane's) compile every configuration. The whole
# six-target matrix is about 7,700 CPU-seconds with a cold Triton cache, more than a 2-core CI
# machine's 90 minutes leave beside the tests; `make compile-matrix-all` runs it (docs/ci.md).
COMPILE_SMOKE_TARGETS ?= sm_80,sm_100,gfx90a,gfx950
# Conformance lanes of `make test`: every built-in backend that can load here (cpu and
# triton-interpret on CI; cuda or rocm too on a GPU machine). Evaluated when `make test` runs.
CONFORMANCE_BACKENDS ?= $(shell $(PY) -c "from spec_hal.selection import available_backends as a; \
	print(' '.join(n for n in ('cpu', 'triton-interpret', 'cuda', 'rocm') if a()[n] is None))")
# The oldest supported Triton (what the GPU image has); its compile matrix runs in a side venv.
PREVIOUS_TRITON ?= 3.6.0
PREVIOUS_VENV ?= .venv-triton-$(PREVIOUS_TRITON)
# Its targets: the GPU image's (sm_90) and the main ROCm one (gfx942), in CI at one configuration
# per kernel (every configuration: about 2,600 CPU-seconds cold; `make compile-matrix-all`).
PREVIOUS_TARGETS ?= sm_90,gfx942
PREVIOUS_SMOKE_TARGETS ?= sm_90,gfx942
export SPEC_HAL_VENV := $(VENV)

.PHONY: setup setup-test demo test test-quick conformance compile-matrix compile-matrix-previous compile-matrix-all

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh ""

setup-test:
	PYTHON=$(PYTHON) bash scripts/setup.sh "test,triton,examples"

demo: setup
	$(PY) -m spec_hal.cli demo

# The full suite CI runs: the project's tests, the conformance suite on every backend this machine
# has (one line per case), then every Triton kernel compiled offline for six GPU targets (four of
# them at one configuration per kernel, above). The conformance lanes run beside the tests, in a
# second process: each is mostly one thread and CI has 2 cores (one after the other they took
# 39 + 20 minutes with a cold Triton cache, most of CI's 90). The lanes' output follows the tests'
# when both are done; either failing fails the target.
# Through a variable: a recipe line naming $(MAKE) itself runs even under `make -n`, and this one
# would run the tests.
CONFORMANCE_LANES = $(MAKE) --no-print-directory conformance
test: setup-test
	mkdir -p $(REPORTS)
	@echo "conformance lanes run beside the tests; their output ($(REPORTS)/conformance.log) follows the tests'"
	$(CONFORMANCE_LANES) > $(REPORTS)/conformance.log 2>&1 & lanes=$$!; \
	trap 'kill $$lanes 2>/dev/null' INT TERM; \
	$(PY) -m pytest tests -v -rs --durations=15; tests_status=$$?; \
	wait $$lanes; lanes_status=$$?; \
	echo "== conformance lanes (ran beside the tests): exit $$lanes_status"; cat $(REPORTS)/conformance.log; \
	test $$tests_status = 0 && test $$lanes_status = 0
	$(MAKE) --no-print-directory compile-matrix

conformance: setup-test
	mkdir -p $(REPORTS)
	@echo "conformance lanes: $(CONFORMANCE_BACKENDS)"
	set -e; for backend in $(CONFORMANCE_BACKENDS); do \
		echo "== spec-hal conformance --backend $$backend"; \
		$(PY) -m spec_hal.cli conformance --backend $$backend -v --known-issues ci/xfail/$$backend.toml \
			--json $(REPORTS)/conformance-$$backend.json --junit $(REPORTS)/conformance-$$backend.xml; \
	done

# The edit-test loop (a few minutes on two cores): the unit tests without the slow ones, the cpu
# lane's quick grid, and a sample of the interpreter lane (golden vectors and bad-input cases).
test-quick: setup-test
	$(PY) -m pytest tests -q -x -m "not slow"
	$(PY) -m spec_hal.cli conformance --backend cpu --quick -q
	$(PY) -m spec_hal.cli conformance --backend triton-interpret --quick -q -k "golden or rejects"

compile-matrix: setup-test
	mkdir -p $(REPORTS)
	$(PY) -m spec_hal.cli compile-matrix --targets $(COMPILE_TARGETS) \
		$(if $(COMPILE_SMOKE_TARGETS),--smoke-targets $(COMPILE_SMOKE_TARGETS)) \
		--json $(REPORTS)/compile-matrix.json --markdown $(REPORTS)/compile-matrix.md

# A side venv on top of $(VENV) (its packages are found through a .pth file) with the older Triton.
compile-matrix-previous: setup-test
	test -x $(PREVIOUS_VENV)/bin/python || $(PYTHON) -m venv --system-site-packages --without-pip $(PREVIOUS_VENV)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > \
		"$$($(PREVIOUS_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/spec-hal-base.pth"
	$(PREVIOUS_VENV)/bin/python -c "import triton, sys; sys.exit(triton.__version__ != '$(PREVIOUS_TRITON)')" \
		|| $(PREVIOUS_VENV)/bin/python -m pip install --quiet --no-deps "triton==$(PREVIOUS_TRITON)"
	mkdir -p $(REPORTS)
	$(PREVIOUS_VENV)/bin/python -m spec_hal.cli compile-matrix --targets $(PREVIOUS_TARGETS) \
		$(if $(PREVIOUS_SMOKE_TARGETS),--smoke-targets $(PREVIOUS_SMOKE_TARGETS)) \
		--json $(REPORTS)/compile-matrix-triton-$(PREVIOUS_TRITON).json \
		--markdown $(REPORTS)/compile-matrix-triton-$(PREVIOUS_TRITON).md

# Every configuration on every target with both Triton versions (what a kernel change should pass
# before it lands; hours on two cores with a cold cache, minutes with a warm one).
compile-matrix-all:
	$(MAKE) --no-print-directory compile-matrix COMPILE_SMOKE_TARGETS=
	$(MAKE) --no-print-directory compile-matrix-previous PREVIOUS_SMOKE_TARGETS=
