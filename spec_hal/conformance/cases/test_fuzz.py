"""Bad-input fuzz of every op (spec_hal/conformance/fuzz.py): each argument in turn gets a
hostile value; the backend must raise the reference's InvalidInput (naming the same argument) or
return the reference's answer, with inputs unmodified and out= canaries intact. Hypothesis picks
the cases (``SPEC_HAL_FUZZ_EXAMPLES`` per op, default 12; the whole matrix runs in
``scripts/reliability_sweep.py``), derandomised so that CI runs are reproducible."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_hal.conformance import fuzz

EXAMPLES = int(os.environ.get("SPEC_HAL_FUZZ_EXAMPLES", "12"))
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# Interesting integers: boundaries of int32/int64, -1, small negatives, the sizes in the baselines.
INTEGERS = st.one_of(st.sampled_from([-1, -2, 0, 1, 2, 3, 4, 5, 6, 15, 16, 2**31 - 1, -2**31, 2**32 + 1, 2**40, -2**40, 2**63 - 1]),
                     st.integers(min_value=-2**62, max_value=2**62))


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv("SPEC_HAL_CHECKS", raising=False)


def _op_cases():
    return [pytest.param(op, marks=pytest.mark.spec_hal_op(op)) for op in fuzz.BASELINES]


@pytest.mark.parametrize("op", _op_cases())
def test_hostile_argument(backend, op):
    cases = [case for case in fuzz.matrix([op])]

    @FUZZ_SETTINGS
    @given(case=st.sampled_from(cases))
    def check(case):
        fuzz.run_case(backend, *case)

    check()


@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.spec_hal_op(op)) for op in fuzz.BASELINES if fuzz.integer_arguments(op)])
def test_hostile_index_values(backend, op):
    arguments = fuzz.integer_arguments(op)

    @FUZZ_SETTINGS
    @given(argument=st.sampled_from(arguments), position=st.integers(0, 63), number=INTEGERS)
    def check(argument, position, number):
        fuzz.run_value_case(backend, op, argument, position, number)

    check()


@pytest.mark.parametrize("label, call", [pytest.param(label, call, marks=pytest.mark.spec_hal_op(label.split("(")[0]), id=label)
                                         for label, call in fuzz.huge_sizes()])
def test_huge_sizes_are_rejected(backend, label, call):
    assert fuzz.outcome(backend, call, label).startswith("InvalidInput")
