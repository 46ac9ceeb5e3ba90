#!/usr/bin/env bash
# Single node, any number of processes, CPU (gloo) or GPU (NCCL):
#   NPROC=2 launch/torchrun.sh tiny-cpu --use-distributed-optimizer --save checkpoints/tiny
# The first argument names a file in launch/configs/; the rest are passed to pretrain_gpt.py
# after the config's flags, so they override it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
config="${1:?usage: launch/torchrun.sh CONFIG [pretrain_gpt.py flags]}"
shift
config_file="$here/configs/$config.sh"
[[ -f "$config_file" ]] || { echo "launch/torchrun.sh: no config '$config' in $here/configs" >&2; exit 2; }
# torchrun's own values for --nproc-per-node: a count, or auto / cpu / gpu.
[[ "${NPROC:-1}" =~ ^([1-9][0-9]*|auto|cpu|gpu)$ ]] || {
  echo "launch/torchrun.sh: NPROC must be a process count or auto, cpu, gpu; got '$NPROC'" >&2
  exit 2; }
# shellcheck source=/dev/null
source "$config_file"
PYTHON="${PYTHON:-$here/../.venv/bin/python}"
export TORCHDYNAMO_DISABLE="${TORCHDYNAMO_DISABLE:-1}"
exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-1}" \
  "$here/../pretrain_gpt.py" "${CONFIG_ARGS[@]}" "$@"
