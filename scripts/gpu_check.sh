#!/usr/bin/env bash
# GPU checks for a lent device machine (one H100 or H200; no Ray, no model files, <= 64 MiB
# carried). Runs every test marked gpu and the GPU benchmarks in under 8 minutes (each step has
# its own ceiling) and leaves logs in $OUT.
#   here, first:  bash scripts/gpu_wheels.sh          (the packages the device image lacks)
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
status=0
# Each step runs under its own ceiling and never past BUDGET_S from the start, so the whole
# script ends inside one device call (600 s at most) with the logs of what ran.
BUDGET_S=${BUDGET_S:-570}
ceil() { local left=$((BUDGET_S - SECONDS)); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
# Every test marked gpu, wherever it lives: tests/gpu (Triton attention incl. sliding-window
# and MLA shapes, CUDA-graph decode, a windowed Mistral engine against transformers, a prefill
# and a decode worker process handing over on one device), CUDA IPC and CUDA caches over TCP
# (tests/unit/kv_transfer), quantized CUDA matmuls (tests/unit/engine/quant).
mapfile -t gpu_tests < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
timeout $(ceil 300) python3 -m pytest "${gpu_tests[@]}" -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" || status=1
# GPU -> TCP -> GPU and CUDA IPC between two processes, against a raw host socket and a
# device gather, in one run.
timeout $(ceil 120) python3 -m bench.transfer.kv_transfer_gpu --gib 0.5 --json "$OUT/kv_transfer_gpu.json" 2>&1 | tee "$OUT/bench_kv_transfer_gpu.log" || status=1
timeout $(ceil 120) python3 -m bench.engine.attention 2>&1 | tee "$OUT/bench_attention.log" || status=1
# The engine benchmark's llama1b batches need most of its ceiling.
timeout $(ceil 240) python3 -m bench.engine.gpu --json "$OUT/engine_gpu.json" 2>&1 | tee "$OUT/bench_engine_gpu.log" || status=1
# A measured GPU profile of a SmolLM2-shaped random bf16 model, for tandem plan's roofline
# (tandem/planner/roofline.py) to be checked against.
timeout $(ceil 90) python3 -c "from pathlib import Path; from bench.engine.gpu import _checkpoint; print(_checkpoint('smollm2', Path('/tmp/gpu_profile')))" \
    > "$OUT/profile.log" 2>&1 || status=1
timeout $(ceil 200) python3 -c "import sys; from tandem.cli.main import main; sys.exit(main())" profile \
    --model /tmp/gpu_profile/smollm2 --device cuda --dtype bfloat16 \
    --out "$OUT/profile_gpu_smollm2.json" >> "$OUT/profile.log" 2>&1 || status=1
echo "gpu_check exit status: $status" | tee -a "$OUT/gpu.txt"
exit $status
