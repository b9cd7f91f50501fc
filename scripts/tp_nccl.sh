#!/usr/bin/env bash
# Issue 19 on GPUs: the tensor-parallel engine loop over NCCL (RCCL on ROCm torch), one process
# per GPU, CUDA graphs on, every rank's tokens compared, a rank-local-seed run that the consensus
# check must catch (2+ GPUs), and the capture self-test (broadcast_verdict + gather_fingerprints
# inside one CUDA graph).
#   usage: bash scripts/tp_nccl.sh [NPROC=2] [ROUNDS=1000]
# Writes $OUT/tp_nccl_<NPROC>.json (or ./tp_nccl_<NPROC>.json without $OUT); exit 0 iff every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${1:-2}
ROUNDS=${2:-1000}
# NVLink multicast stays off (NVLS can take shared GPUs out of service); nothing here needs it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
exec "${PYTHON:-python3}" -m spec_hal.testing.tp_engine --dist-backend nccl --nproc "$NPROC" --rounds "$ROUNDS" \
    --graphs --timeout 560 --out "${OUT:-.}/tp_nccl_${NPROC}.json"
