#!/usr/bin/env bash
# The checks this repository runs on a CUDA GPU, in one go, on a machine with no hub and no package
# index (torch, transformers, numba, click, pytest and hypothesis already installed there):
#   1. the CUDA-graph step's own tests (tests/test_graphs.py: captured graphs, greedy equal to generate);
#   2. random-weight models of SmolLM2-1.7B's and Llama-8B's shapes in bfloat16
#      (benchmarks/graph_step.py): the step per row count eager and graphed, the memory roofline, and a
#      decode against transformers greedy (a random model's text: its tokens per step are noise);
#   3. the exactness suites with their tiny models on the GPU (tests/conftest.py's --device), graphs on;
#   4. the server's tests (tests/test_serve.py: the real server on loopback, the openai client) with its
#      tiny model on the GPU, where the serve extra's packages import there (carried as wheels onto a machine
#      with no index: fastapi needs opentelemetry-api, openai httpx2; the import's error is printed if not).
# Usage: benchmarks/gpu_check.sh OUT_DIR [SHAPE ...]   (shapes of benchmarks/shaped_model.py; default
#        smollm2-1.7b and llama-8b-shape)
set -u
export PYTHONUNBUFFERED=1
out=$1
shift
shapes="${*:-smollm2-1.7b llama-8b-shape}"
shape_args=()
for s in $shapes; do shape_args+=(--shape "$s"); done
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
lscpu | grep "Model name" | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers, numba; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numba', numba.__version__)" | tee -a "$out/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | grep -v WARNING | tail -3
echo "== 1. the graphed step's tests on cuda"
timeout 150 python3 -m pytest tests/test_graphs.py --device cuda -q -n 4 -p no:cacheprovider -p no:benchmark --tb=short 2>&1 | tail -40 | tee "$out/graphs.txt"
echo "== 2. the step eager and graphed, bfloat16"
timeout 200 python3 -m lookahead.benchmarks.graph_step "${shape_args[@]}" --dtype bfloat16 \
    --new 96 --calibration-seconds 4 --out "$out/graph_step.json" 2>&1 | grep -v -i "warn" | tee "$out/graph_step.txt"
echo "== 3. exactness on cuda (graphs on by default)"
timeout 150 python3 -m pytest tests/test_exactness.py tests/test_batch.py tests/test_continuous.py --device cuda -q -n 8 -p no:benchmark \
    -p no:cacheprovider --tb=line 2>&1 | tail -25 | tee "$out/exactness.txt"
echo "== 4. the server's tests on cuda"
if why=$(python3 -c "import fastapi, uvicorn, openai, httpx" 2>&1); then
    timeout 120 python3 -m pytest tests/test_serve.py --device cuda -q -n 4 -p no:cacheprovider -p no:benchmark --tb=short 2>&1 \
        | tail -30 | tee "$out/serve.txt"
else
    echo "skipped: fastapi, uvicorn, openai or httpx does not import here: ${why##*$'\n'}" | tee "$out/serve.txt"
fi
