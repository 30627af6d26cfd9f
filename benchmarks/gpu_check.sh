#!/usr/bin/env bash
# The checks this repository runs on a CUDA GPU, in one go, on a machine with no hub and no package
# index (torch, transformers, numba, click, pytest and hypothesis already installed there):
#   1. the exactness suites with their tiny models on the GPU (tests/conftest.py's --device);
#   2. a random-weight model of SmolLM2-1.7B's shape (benchmarks/shaped_model.py) in bfloat16:
#      its roofline and step cost per row count, the host's share of a step, host syncs per step,
#      and the bench against transformers greedy (its tokens per step are a random model's: noise).
# Usage: benchmarks/gpu_check.sh TOKENIZER_DIR OUT_DIR  (TOKENIZER_DIR: SmolLM2's tokenizer.json etc.)
set -u
export PYTHONUNBUFFERED=1
tok=$1
out=$2
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers, numba; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numba', numba.__version__)" | tee -a "$out/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | grep -v WARNING | tail -3
echo "== 1. exactness on cuda"
timeout 300 python3 -m pytest tests/test_exactness.py tests/test_batch.py tests/test_continuous.py --device cuda -q -p no:cacheprovider --tb=line 2>&1 | tail -25 | tee "$out/exactness.txt"
echo "== 2. smollm2-1.7b shape, bfloat16"
model=/tmp/shaped-1.7b
python3 -m lookahead.benchmarks.shaped_model build --shape smollm2-1.7b --tokenizer "$tok" --out "$model" --dtype bfloat16 --device cuda 2>&1 | tail -1
timeout 150 lookahead roofline --model "$model" --device cuda --dtype bfloat16 --rows 1 --rows 4 --rows 8 --rows 16 --rows 32 --rows 64 --rows 128 --out "$out/roofline" 2>&1 | grep -v "Loading weights" | tail -45
timeout 60 python3 -m lookahead.benchmarks.shaped_model syncs --model "$model" --device cuda --dtype bfloat16 2>&1 | tail -20 | tee "$out/syncs.txt"
timeout 200 lookahead bench --model "$model" --device cuda --dtype bfloat16 --dataset translate --dataset humaneval-chat --limit 2 --max-new-tokens 128 --turn1 --out "$out/bench" 2>&1 | grep -v "Loading weights" | tail -40
