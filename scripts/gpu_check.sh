#!/usr/bin/env bash
# GPU checks for a lent device machine (one H100 or H200; no Ray, no model files, <= 64 MiB
# carried). Runs every test marked gpu and the GPU benchmarks in under 8 minutes (each step has
# its own ceiling) and returns its logs as $OUT/gpu_check.tgz.
#   here, first:  bash scripts/gpu_wheels.sh          (the packages the device image lacks)
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
# Logs go to $W and come back as one archive ($OUT/gpu_check.tgz: the device tool returns at
# most 8 files) beside gpu.txt, the summary.
OUT=${OUT:-/tmp/gpu_check}
W=/tmp/gpu_check_logs
mkdir -p "$OUT" "$W"
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
# and a decode worker process handing over on one device, MoE engines on the Triton experts
# against the torch path), CUDA IPC and CUDA caches over TCP (tests/unit/kv_transfer),
# quantized CUDA matmuls (tests/unit/engine/quant), the Triton MoE kernels compiled
# (tests/unit/engine/models/test_moe_triton.py).
mapfile -t gpu_tests < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
timeout $(ceil 300) python3 -m pytest "${gpu_tests[@]}" -q -m gpu -p no:cacheprovider 2>&1 | tee "$W/gpu_tests.log" || status=1
# GPU -> TCP -> GPU and CUDA IPC between two processes, against a raw host socket and a
# device gather, in one run.
timeout $(ceil 120) python3 -m bench.transfer.kv_transfer_gpu --gib 0.5 --json "$W/kv_transfer_gpu.json" 2>&1 | tee "$W/bench_kv_transfer_gpu.log" || status=1
timeout $(ceil 120) python3 -m bench.engine.attention 2>&1 | tee "$W/bench_attention.log" || status=1
# The engine benchmark's llama1b batches need most of its ceiling.
timeout $(ceil 240) python3 -m bench.engine.gpu --json "$W/engine_gpu.json" 2>&1 | tee "$W/bench_engine_gpu.log" || status=1
# A measured GPU profile of a SmolLM2-shaped random bf16 model, for tandem plan's roofline
# (tandem/planner/roofline.py) to be checked against.
timeout $(ceil 90) python3 -c "from pathlib import Path; from bench.engine.gpu import _checkpoint; print(_checkpoint('smollm2', Path('/tmp/gpu_profile')))" \
    > "$W/profile.log" 2>&1 || status=1
timeout $(ceil 200) python3 -c "import sys; from tandem.cli.main import main; sys.exit(main())" profile \
    --model /tmp/gpu_profile/smollm2 --device cuda --dtype bfloat16 \
    --out "$W/profile_gpu_smollm2.json" >> "$W/profile.log" 2>&1 || status=1
# Disaggregated vs colocated on the machine's CPU cores (16 beside the GPU; two here cannot
# show it): prefill and decode workers pinned to 8 cores each against one colocated worker on
# all 16, the same Poisson arrivals, a short rate sweep on the SmolLM2-shaped random model with
# SmolLM2's tokenizer (carried by gpu_wheels.sh).
ncores=$(nproc)
if [ -d .whl/smollm2_tokenizer ] && [ -d /tmp/gpu_profile/smollm2 ] && [ "$ncores" -ge 8 ]; then
    cp .whl/smollm2_tokenizer/* /tmp/gpu_profile/smollm2/
    cores=$(( ncores >= 16 ? 16 : ncores / 2 * 2 ))
    timeout $(ceil 60) python3 -m tandem.engine.native > "$W/native_build.log" 2>&1 || status=1
    timeout $(ceil 240) python3 -m scripts.bench_serve --model /tmp/gpu_profile/smollm2 \
        --cores "$cores" --setups disagg,colocated --sweep 1,2,4 --mixes mixed \
        --num-requests 24 --out "$W/serve_cpu$cores" 2>&1 | tee "$W/bench_serve_cpu.log" || status=1
fi
echo "gpu_check exit status: $status (seconds: $SECONDS)" | tee -a "$OUT/gpu.txt"
tar czf "$OUT/gpu_check.tgz" -C "$W" . || status=1
exit $status
