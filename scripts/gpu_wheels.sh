#!/usr/bin/env bash
# Wheels a lent device machine lacks (its image has torch, triton and transformers but not
# these), for Python 3.12 there, at the versions this venv runs: downloaded here into .whl/
# (git-ignored), carried with the working tree (device tool: carry [".whl"]) and installed
# there by scripts/gpu_check.sh before anything runs; SmolLM2's tokenizer files beside them.
#   usage: bash scripts/gpu_wheels.sh            (run here, where pip can reach the index)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NAMES="gguf xgrammar apache-tvm-ffi pydantic pydantic_core annotated-types typing-inspection
grpcio grpcio-health-checking grpcio-reflection protobuf cryptography cffi pycparser
opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions msgpack xxhash"
rm -rf .whl && mkdir -p .whl
for name in $NAMES; do
    pin=$("$PY" -m pip freeze 2>/dev/null | grep -i -E "^${name//[-_]/[-_]}==" || true)
    [ -n "$pin" ] || { echo "gpu_wheels: $name is not installed in $PY's venv" >&2; exit 1; }
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 -d .whl "$pin"
done
# SmolLM2's tokenizer (no weights: the device builds a random model of its shape) for the
# serving sweep's router.
tok=$("$PY" -c "from tandem.engine.loader import resolve_model; print(resolve_model('smollm2'))")
mkdir -p .whl/smollm2_tokenizer
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$tok"/chat_template.jinja .whl/smollm2_tokenizer/
du -sh .whl
