#!/usr/bin/env bash
# One-time set-up used by `make demo` and `make test`: installs spec_hal (editable) with what it
# needs, without replacing a torch or Triton the machine already has.
set -euo pipefail
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    # No torch yet: take the CPU build (on this project's CI machines it comes from local disk;
    # an unpinned torch would pull several GB of CUDA wheels). GPU users install their own first.
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi

# examples: transformers, for tests/test_examples.py (examples/hf_transformers.py); it does not
# depend on torch, so nothing here replaces the machine's torch.
extras="test,examples"
if ! "$PYTHON" -c "import triton" 2>/dev/null; then
    if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.version.hip else 1)"; then
        echo "setup: ROCm torch without Triton; install pytorch-triton-rocm (never the CUDA 'triton' wheel)" >&2
    else
        extras="$extras,triton"  # the interpreter lane and the offline compile matrix need it
    fi
fi

# Always (re)install this checkout: an editable install of another checkout would otherwise be
# imported instead (its package-dir mapping points at that checkout's backends/ and kernels/).
"$PYTHON" -m pip install --quiet -e ".[$extras]"
