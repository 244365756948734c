#!/usr/bin/env bash
# The GPU checks in one script, for a GPU machine that has torch, triton and transformers but
# not DeepSpeed: DeepSpeed and its pure-Python needs travel as wheels in .whl/ (`make
# gpu-wheels` builds them on a machine with PyPI). Each step's output goes to $OUT (default
# ./gpu-results); bench/RESULTS.md records what ran, with the environment line written here.
#
#   bash bench/gpu_checks.sh tier bench-125m         # the GPU tier, then the 125M bench
#   bash bench/gpu_checks.sh compiled-1-3b fp16-1-3b # one step per argument, in that order
#
# Steps (each under its own time limit, so that one slow step leaves time for the next):
#   tier            pytest -m gpu (lm-eval's modules are left out: no GPU test there)
#   bench-125m      125M bf16 seq 2048 micro 8, fusions as configured and on, HF eager, profile
#   compiled-SIZE   SIZE (125m, 350m, 1-3b) bf16, ours with the fusion flags and with
#                   torch_compile too, against HF with torch.compile + fused AdamW, profile
#   fp16-1-3b       1-3B fp16 (dynamic loss scale) against HF eager with GradScaler
#   cross-entropy   the cross entropy's Triton kernels against torch's on fp32 logits, 16,384
#                   tokens x 50,304 (125M at micro batch 8, seq 2048), bf16
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if ! python3 -c "import deepspeed" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "no DeepSpeed and no usable .whl/"; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} DS_ACCELERATOR=cuda PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false
{ # the commit make gpu-wheels recorded (a copied tree's .git can be another commit's)
  echo "commit $(cat .whl/commit 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, deepspeed, transformers, triton; print('python',
      sys.version.split()[0], 'torch', torch.__version__, 'deepspeed', deepspeed.__version__,
      'transformers', transformers.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
start=$(date +%s)
# GPU_CHECKS_SECONDS (default 570): the whole run's time; a step gets the lesser of its own
# limit and what is left, and is skipped when under 30 s is left
deadline=$(( start + ${GPU_CHECKS_SECONDS:-570} ))
limit() { local left=$(( deadline - $(date +%s) )); echo $(( $1 < left ? $1 : left )); }

bench() {  # bench LIMIT_S ARGS...: one bench/train.py run, its rows appended to bench.log
    timeout "$(limit "$1")" python3 bench/train.py "${@:2}" 2>&1 \
        | grep -v "real_accelerator\|USDT" | tee -a "$OUT/bench.log"
    echo "bench ${*:2}: status ${PIPESTATUS[0]} at $(( $(date +%s) - start )) s" \
        | tee -a "$OUT/bench.log"
}

for step in "$@"; do
    if (( $(limit 30) < 30 )); then
        echo "$step: not run, under 30 s left" | tee -a "$OUT/bench.log"; continue
    fi
    case $step in
        tier)  # in 4 processes where pytest-xdist is there; no test may take over 150 s
            parallel=(); python3 -c "import xdist" 2>/dev/null && parallel=(-n 4)
            python3 -c "import pytest_timeout" 2>/dev/null && parallel+=(--timeout 150)
            timeout "$(limit 200)" python3 -m pytest -q -m gpu tests --ignore=tests/evaluation \
                -p no:cacheprovider --durations=15 "${parallel[@]}" > "$OUT/test-gpu.log" 2>&1
            echo "tier: status $? at $(( $(date +%s) - start )) s" | tee -a "$OUT/test-gpu.log"
            tail -25 "$OUT/test-gpu.log" ;;
        bench-125m)
            bench 150 --sizes 125m --seq 2048 --micro 8 --dtypes bf16 --steps 5 --warmup 3 \
                --fusions config on --reference eager --profile 15 ;;
        compiled-125m|compiled-350m|compiled-1-3b)  # the reference's layers compiled
            bench 280 --sizes "${step#compiled-}" --seq 2048 --micro 8 --dtypes bf16 --steps 4 \
                --warmup 3 --fusions on compile --reference compiled --profile 12 ;;
        fp16-1-3b)
            bench 200 --sizes 1-3b --seq 2048 --micro 8 --dtypes fp16 --steps 4 --warmup 3 \
                --fusions on --reference eager ;;
        cross-entropy)
            timeout "$(limit 90)" python3 bench/cross_entropy.py --tokens 16384 \
                --dtypes bfloat16 2>&1 | tee -a "$OUT/bench.log" ;;
        *) echo "unknown step '$step': tier, bench-125m, compiled-125m, compiled-350m," \
                "compiled-1-3b, fp16-1-3b, cross-entropy"; exit 2 ;;
    esac
done
