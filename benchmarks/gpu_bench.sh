#!/usr/bin/env bash
# The GPU run, on one GPU machine that has PyTorch, Triton, ONNX, ONNX Runtime and SciPy but no
# network: the GPU tests, then the paper's five models (or MODELS) built, optimized for CUDA
# (profiling budget per model below) with korch's whole-graph and greedy variants
# (benchmarks/ablation.py), and timed against torch.compile: default, freezing, max-autotune with
# freezing, CUDA graphs with and without freezing. Results (ablation.json, logs) go to $OUT. korch
# runs from the source tree (no install: the machine's torch version is kept). Every step has its
# own time limit, smallest models first, and each model's result is stored as soon as it is
# timed, so a slow model costs only itself: each model may take what is left of the DEADLINE
# (seconds from the start, default 575) shared equally among the models still to run, so time a
# fast model leaves goes to the slower ones after it. Before the ablation a model took 100-160 s
# on an H200 (benchmarks/results/gpu-2026-12-04-h200.log); the ablation's two variants, three
# more peers and the inductor-autotune backend (default on CUDA; each of its kernels autotuned in
# the timing worker, a job limited to ProfileOptions.time_timeout) have not run on a GPU yet. In one
# call of at most 10 minutes (the GPU tests, then the five models in what is left of 575 s):
#
#   OUT=gpu-results bash benchmarks/gpu_bench.sh 20
#
# or, where a session has the device time, over two calls, the GPU tests in the first:
#
#   OUT=gpu-results DEADLINE=395 MODELS="yolox-nano efficientvit-b1" bash benchmarks/gpu_bench.sh 20
#   OUT=gpu-results DEADLINE=465 TESTS=0 MODELS="segformer-b0 candy yolov4" bash benchmarks/gpu_bench.sh 20
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-results}
BUDGET=${1:-20}
DEADLINE=${DEADLINE:-575}
[[ "$DEADLINE" =~ ^[1-9][0-9]*$ ]] || { echo "DEADLINE: whole seconds, got '$DEADLINE'" >&2; exit 2; }
MODELS=${MODELS:-yolox-nano efficientvit-b1 segformer-b0 candy yolov4}
TESTS=${TESTS:-1}  # 0: no GPU tests (a second call's models)
mkdir -p "$OUT"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
# the torch.compile peers compiled once in the background (mostly CPU work), so that each model's
# bench finds them in Inductor's on-disk caches instead of compiling them inside its share
PEERS=torch-compile,torch-compile-freezing,torch-compile-cudagraphs,torch-compile-cudagraphs-freezing,torch-compile-max-autotune-freezing
python3 benchmarks/warm_peers.py $MODELS --device cuda --peers $PEERS > "$OUT/warm-peers.log" 2>&1 &
if [ "$TESTS" != 0 ]; then
    # one line per test as it ends: a run stopped by its time limit still says what passed
    # (-v), and a test running past 60 s prints every thread's stack (faulthandler_timeout)
    # (the backends' own GPU tests, `pytest -m gpu tests/backends`, would take the models' time)
    timeout 150 python3 -m pytest -v -m gpu --durations=5 -o faulthandler_timeout=60 tests/e2e/test_gpu.py \
        > "$OUT/gpu-tests.log" 2>&1
    echo "exit $?" >> "$OUT/gpu-tests.log"
fi
# the ONNX exports run on the CPU, all models at once (about a minute)
timeout 60 python3 -m korch.cli.commands zoo $MODELS --dir /tmp/korch-zoo > "$OUT/zoo-bench.log" 2>&1
left=$(echo $MODELS | wc -w)
for model in $MODELS; do
    share=$(( (DEADLINE - SECONDS) / left )); left=$(( left - 1 ))
    echo "$(date +%T) $model: up to ${share} s" >> "$OUT/zoo-bench.log"
    [ "$share" -ge 20 ] || continue  # (timeout 0 would mean no limit at all)
    timeout "$share" python3 benchmarks/ablation.py "$model" \
        --device cuda --dir /tmp/korch-zoo --out "$OUT" --time-budget "$BUDGET" --rounds 5 \
        --variants korch-whole-graph,korch-greedy --peers $PEERS >> "$OUT/zoo-bench.log" 2>&1
    rc=$?  # (before any other command: 124 is the time limit)
    echo "$(date +%T) $model: exit $rc" >> "$OUT/zoo-bench.log"
done
# every kernel profiled, for the per-kernel breakdown (sqlite3 reads it)
gzip -c "$OUT/profiles-cuda.sqlite" > "$OUT/profiles-gpu.sqlite.gz" 2>/dev/null && rm -f "$OUT/profiles-cuda.sqlite"
tail -n 40 "$OUT"/*.log
