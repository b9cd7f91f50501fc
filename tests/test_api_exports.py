"""The API explains itself: the types ops take and return, and their limits, come from
``spec_hal`` and appear in ``help(spec_hal)``."""
from __future__ import annotations

import os
import pydoc

import spec_hal
from spec_hal import kv, mamba, topk, types

EXPORTED = {
    "DraftTree": types.DraftTree, "Verdict": types.Verdict, "TreeRecord": types.TreeRecord,
    "Expansion": types.Expansion, "DraftState": types.DraftState, "DraftResult": types.DraftResult,
    "DraftSlots": kv.DraftSlots, "MambaCommit": mamba.MambaCommit,
}


def test_result_types_and_limits_are_exported():
    for name, value in EXPORTED.items():
        assert getattr(spec_hal, name) is value and name in spec_hal.__all__
    assert spec_hal.MAX_TOPK == topk.MAX_TOPK == 16


def test_help_shows_the_types_explain_and_the_limit():
    text = pydoc.render_doc(spec_hal, renderer=pydoc.plaintext)
    for name in EXPORTED:
        assert f"class {name}" in text, name
    assert "explain(name" in text and "MAX_TOPK = 16" in text


def test_explain_stays_the_function_after_its_module_is_imported():
    # A fresh process: the first access imports spec_hal.explain (the module), which binds the
    # module to the package attribute; the second access must still give the function.
    import subprocess
    import sys

    code = ("import inspect, spec_hal\n"
            "first, second = spec_hal.explain, spec_hal.explain\n"
            "assert inspect.isfunction(first) and second is first, (first, second)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_error_messages_name_types_users_can_import():
    # "expected a spec_hal.DraftTree" must point at something that exists.
    import torch

    try:
        spec_hal.verify_greedy(object(), torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    except spec_hal.InvalidInput as error:
        assert "spec_hal.DraftTree" in str(error)
        assert spec_hal.DraftTree is types.DraftTree
    else:
        raise AssertionError("verify_greedy accepted a tree that is not a DraftTree")


def test_the_cpu_backend_never_imports_triton():
    import subprocess
    import sys

    code = ("import sys, torch, spec_hal\n"
            "spec_hal.draft_topk(torch.randn(2, 10), 2)\n"
            "assert spec_hal.probe('cpu').triton_version is None or 'triton' not in sys.modules\n"
            "spec_hal.explain('cpu')\n"
            "assert 'triton' not in sys.modules, 'the cpu path imported triton'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SPEC_HAL_BACKEND": "cpu"})
    assert result.returncode == 0, result.stderr
