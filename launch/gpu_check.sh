#!/usr/bin/env bash
# GPU check (one GPU, under 8 minutes): installs the CPU requirements plus Transformer Engine,
# then runs tests/gpu — TE BF16/FP8 steps, FP8 really active, ZeRO-Offload / Megatron-FSDP on
# GPU, and the MFU of a ~1.3B GPT in BF16 and FP8 (printed).
#   launch/gpu_check.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
make install
.venv/bin/python -m pip install --quiet -r requirements-gpu.txt
export TORCHDYNAMO_DISABLE=1
exec timeout 480 .venv/bin/python -m pytest -q -s tests/gpu "$@"
