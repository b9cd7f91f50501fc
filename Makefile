# The two commands of README.md. Both set up everything they need first.
PYTHON ?= python3
REPORTS ?= reports

.PHONY: setup demo test

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

demo: setup
	$(PYTHON) -m spec_hal.cli demo

test: setup
	SPEC_HAL_REPORT_DIR=$(REPORTS) $(PYTHON) -m pytest tests -v -rs --durations=15
