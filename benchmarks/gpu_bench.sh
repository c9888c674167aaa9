#!/usr/bin/env bash
# The GPU run, start to finish in under 10 minutes on one GPU machine that has PyTorch, Triton,
# ONNX, ONNX Runtime and SciPy but no network: the GPU tests, then the paper's five models built,
# optimized for CUDA (profiling budget per model below), verified, and timed against torch.compile
# (default and CUDA graphs) and eager PyTorch. Results (results.json, BENCHMARKS-gpu.md, logs) go
# to $OUT. korch runs from the source tree (no install: the machine's torch version is kept).
#
#   OUT=gpu-results bash benchmarks/gpu_bench.sh [SECONDS_OF_PROFILING_PER_MODEL]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-results}
BUDGET=${1:-25}
mkdir -p "$OUT"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -n 30 > "$OUT/gpu-tests.log"
timeout 480 python3 benchmarks/zoo_bench.py candy segformer-b0 yolox-nano efficientvit-b1 yolov4 \
    --device cuda --dir /tmp/korch-zoo --cache /tmp/korch-gpu.sqlite --out "$OUT" \
    --time-budget "$BUDGET" --peers torch-compile,torch-compile-cudagraphs,eager --rounds 5 --no-rerun \
    --render "$OUT/BENCHMARKS-gpu.md" > "$OUT/zoo-bench.log" 2>&1
echo "exit $?" >> "$OUT/zoo-bench.log"
tail -n 40 "$OUT/zoo-bench.log" "$OUT/gpu-tests.log"
