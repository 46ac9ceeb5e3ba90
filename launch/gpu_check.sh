#!/usr/bin/env bash
# GPU check for the project's GPU test machine: one GPU, no network, Python 3.12 with torch
# preinstalled. No install from an index: the wheels it lacks arrive with the working tree
# (launch/gpu_kit/fetch_wheels.py fetches them here and prints this command with its carry list).
# Installs them into a target folder beside the existing torch, prints the machine, runs tests/gpu
# under a hard time limit, and leaves in $OUT: gpu_figures.json (every figure and every test's
# outcome, rewritten after each test, so a run cut short still reports) and gpu_check.log.
#
#   GPU_KIT=launch/gpu_kit/wheels PYTHON=/opt/torch/.venv/bin/python3 bash launch/gpu_check.sh
#   (extra arguments go to pytest; GPU_CHECK_LIMIT_S caps pytest, default 420 s)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
GPU_KIT=${GPU_KIT:-launch/gpu_kit/wheels}
OUT=${OUT:-$PWD/gpu_out}
LIMIT_S=${GPU_CHECK_LIMIT_S:-420}
SITE=${GPU_SITE:-/tmp/megatron-lgs-gpu-site}
# Cheapest and most telling first: a cut-short run still has the basics.
TESTS=(tests/gpu/test_gpu_local.py tests/gpu/test_gpu_lgs.py tests/gpu/test_gpu_checkpoint.py
       tests/gpu/test_gpu_mfu.py tests/gpu/test_gpu_stepmodel.py tests/gpu/test_gpu_zero.py
       tests/gpu/test_gpu_smoke.py tests/gpu/test_gpu_te.py)

fail() { echo "gpu_check: $*" >&2; exit 2; }

install_kit() {
    local wheels=("$GPU_KIT"/*.whl)
    [ -e "${wheels[0]}" ] || fail "no wheels in $GPU_KIT: run launch/gpu_kit/fetch_wheels.py here and carry that folder"
    rm -rf "$SITE" && mkdir -p "$SITE"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m pip install --quiet --no-index --no-deps --disable-pip-version-check \
            --target "$SITE" "${wheels[@]}" || fail "pip install --target $SITE failed"
    else  # a venv without pip: a wheel is a zip of what --target would place
        for w in "${wheels[@]}"; do "$PYTHON" -m zipfile -e "$w" "$SITE" || fail "unpacking $w failed"; done
    fi
    echo "installed into $SITE: ${wheels[*]##*/}"
}

main() {
    [ -x "$PYTHON" ] || fail "no Python at $PYTHON (set PYTHON=)"
    install_kit
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    export TORCHDYNAMO_DISABLE=1 GPU_FIGURES="$OUT/gpu_figures.json"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PYTHON" -c 'import sys, torch, megatron.core as m; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, torch.cuda.is_available(), "| megatron-core", m.__version__)' \
        || fail "the carried wheels do not import on $PYTHON"
    local started=$SECONDS rc
    timeout -k 15 "$LIMIT_S" "$PYTHON" -m pytest -q -rs -s -p no:cacheprovider "${TESTS[@]}" "$@"
    rc=$?
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "gpu_check: pytest stopped at the ${LIMIT_S} s limit"
    "$PYTHON" -m tests.gpu.figures --finish "$GPU_FIGURES" --exit-code "$rc" \
        --seconds "$((SECONDS - started))"
    echo "gpu_check: pytest exit code $rc; figures in $GPU_FIGURES"
    return "$rc"
}

mkdir -p "$OUT"
main "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
