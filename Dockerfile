# The one llmft image: every KFP component, the PyTorchJob workers and the Vertex CustomJob
# replicas run it (components/runtime/image.py names it; the tag is the package version).
#
# Build and push with Cloud Build (docs/deploy/README.md):
#   gcloud builds submit --config docs/deploy/cloudbuild.yaml \
#     --substitutions=_IMAGE=$(llmft image-tag --full) .
# or locally:  docker build --build-arg VERSION=$(llmft image-tag) -t $(llmft image-tag --full) .
#
# Pins: the base image by exact tag (the Python the test suite runs on), torch by version from
# PyTorch's CUDA wheel index, every other package by constraints.txt. Never a moving tag.
# tests/test_deploy_image.py checks these pins against pyproject.toml and constraints.txt.
#
# It is also a Dataflow custom container (preprocess_runner=DataflowRunner uses it as
# sdk_container_image): Dataflow starts workers with the image's ENTRYPOINT, which must be the
# Beam SDK worker boot of exactly the installed Beam version, copied from the official Beam SDK
# image below. Nothing else uses the entrypoint: KFP tasks, PyTorchJob pods and Vertex CustomJob
# replicas all set their own command, which overrides it. The image runs as root because
# Dataflow's boot writes to root-owned mounts; Kubernetes pods run as the `llmft` user (uid 1000)
# through their securityContext.
FROM python:3.11.7-slim-bookworm

# Same torch version as constraints.txt, CUDA build: the wheels bundle the CUDA runtime, cuDNN and
# NCCL as pip packages, so the base needs no CUDA toolkit; GPU nodes (GKE) and Vertex AI machines
# provide the driver.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG VERSION=unset

LABEL org.opencontainers.image.title="llmft" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="LLM fine-tuning components, trainer and preprocessing"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/home/llmft/.cache/huggingface \
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

# GKE's device plugin mounts the NVIDIA driver at /usr/local/nvidia and sets no environment, so
# without this the CUDA build of torch finds no libcuda.so.1 there and silently runs on CPU
# (components/platform/platform_facts.py: GKE_NVIDIA_LIBRARY_PATH, with its source; the test checks the
# two agree). Vertex AI injects the driver itself; on a machine without GPUs the paths are absent
# and harmless.
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib \
    PATH=/usr/local/nvidia/bin:${PATH}

# A fixed numeric uid so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --gid 1000 llmft \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash llmft

# A C compiler: Triton (what torch.compile generates on GPU, where the trainer compiles by default)
# builds its CUDA launcher with one at run time, and the slim base has none ("Failed to find C
# compiler"). Python's headers come with the base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

# torch first, in its own layer: the largest and the least often changed.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /opt/llmft
COPY pyproject.toml constraints.txt README.md ./
COPY components ./components
COPY pipelines ./pipelines
COPY trainer ./trainer
COPY beam_preprocess ./beam_preprocess
# Not editable: the torchrun.handlers entry point (etcd-v3 rendezvous) comes from the installed
# metadata. constraints.txt's torch==2.13.0 is satisfied by the CUDA wheel (2.13.0+cu128).
RUN pip install -c constraints.txt ".[eval]" \
 && python -c "import torch, kfp, apache_beam, trainer, components, beam_preprocess; print('torch', torch.__version__)"

# The Beam SDK worker boot, from the Beam SDK image of the version constraints.txt pins.
COPY --from=apache/beam_python3.11_sdk:2.77.0 /opt/apache/beam /opt/apache/beam

WORKDIR /home/llmft
ENTRYPOINT ["/opt/apache/beam/boot"]
