#!/usr/bin/env bash
# Set-up used by `make demo`, `make test` and `make test-quick`. Usage: scripts/setup.sh [EXTRAS]
# (EXTRAS: "" for the demo, "test,triton,examples" for the tests: examples = transformers, for
# tests/test_examples.py).
#
# Where it installs: the active virtual environment if there is one ($VIRTUAL_ENV), else a
# `.venv` in the checkout, which it creates (with --system-site-packages, so that a torch or
# Triton the machine already has is reused instead of downloaded again). It never installs into
# the machine's own python. The Makefile runs everything with "$VENV/bin/python".
#
# Repeated runs skip work already done: a stamp in the environment records pyproject.toml's hash
# and the extras installed; while both still cover what is asked, no pip command runs at all.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:-}
BASE_PYTHON=${PYTHON:-python3}

if [ -n "${VIRTUAL_ENV:-}" ]; then
    VENV=$VIRTUAL_ENV
else
    VENV=${SPEC_HAL_VENV:-.venv}
    if [ ! -x "$VENV/bin/python" ]; then
        echo "setup: creating the virtual environment $VENV (machine packages such as torch stay visible)" >&2
        # --without-pip: pip runs from the machine's python (its setuptools and configuration);
        # the environment's own pip would shadow them with older copies.
        "$BASE_PYTHON" -m venv --system-site-packages --without-pip "$VENV"
    fi
fi
PY="$VENV/bin/python"
STAMP="$VENV/.spec-hal-setup"
WANT="$(sha256sum pyproject.toml | cut -c1-16) $(pwd)"

installed_extras() {  # the extras of the last install, if pyproject.toml and the checkout are unchanged
    [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$WANT" ] && sed -n 2p "$STAMP" || true
}

covered() {  # every extra in $1 is in $2
    local extra
    for extra in ${1//,/ }; do
        case ",$2," in *",$extra,"*) ;; *) return 1 ;; esac
    done
}

HAVE=$(installed_extras)
if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$WANT" ] && covered "$EXTRAS" "$HAVE"; then
    echo "$PY" >&2
    exit 0
fi

has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }

# numpy first: torch warns at import when numpy is missing. Nothing here imports torch.
has numpy || "$PY" -m pip install --quiet numpy
if ! has torch; then
    # The CPU build (on this project's CI machines it comes from local disk; an unpinned torch
    # would pull several GB of CUDA wheels). GPU users install their own torch first.
    echo "setup: installing torch==2.13.0 (CPU build) into $VENV" >&2
    "$PY" -m pip install --quiet "torch==2.13.0"
fi

extras=$EXTRAS
if covered triton "$EXTRAS" && has triton; then
    extras=$(echo ",$EXTRAS," | sed 's/,triton,/,/; s/^,//; s/,$//')  # keep the machine's Triton
elif covered triton "$EXTRAS" && "$PY" -c "import importlib.metadata as m, sys; sys.exit('rocm' not in m.version('torch'))"; then
    echo "setup: ROCm torch without Triton; install pytorch-triton-rocm (never the CUDA 'triton' wheel)" >&2
    extras=$(echo ",$EXTRAS," | sed 's/,triton,/,/; s/^,//; s/,$//')
fi
all_extras=$(echo "$HAVE,$EXTRAS" | tr ',' '\n' | grep -v '^$' | sort -u | paste -sd, - || true)

# Always this checkout, editable: another checkout's install would otherwise be imported.
"$PY" -m pip install --quiet -e ".${extras:+[$extras]}"
printf '%s\n%s\n' "$WANT" "$all_extras" > "$STAMP"
echo "setup: spec_hal installed in $VENV${extras:+ with [$extras]}" >&2
