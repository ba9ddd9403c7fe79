#!/usr/bin/env bash
# GPU checks for a lent device machine (one H200; no Ray, no model files, <= 64 MiB carried).
# Runs the CUDA tests and the GPU benchmarks in well under 8 minutes and leaves logs in $OUT.
#   usage (through the device tool): bash scripts/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
status=0
timeout 240 python3 -m pytest tests/gpu -q -m gpu -p no:cacheprovider -x 2>&1 | tee "$OUT/gpu_tests.log" || status=1
timeout 120 python3 -m bench.attention 2>&1 | tee "$OUT/bench_attention.log" || status=1
timeout 150 python3 -m bench.engine_gpu --json "$OUT/engine_gpu.json" 2>&1 | tee "$OUT/bench_engine_gpu.log" || status=1
echo "gpu_check exit status: $status" | tee -a "$OUT/gpu.txt"
exit $status
