# syntax=docker/dockerfile:1
# swerl trainer image for GPU clusters: the learner (torch + DeepSpeed + PEFT) and swerl in /opt/venv,
# SGLang in its own /opt/sglang-venv, the docker CLI for the sandboxes. CI cannot build it (no container
# registry is reachable there); tests/test_dockerfile.py lints it with hadolint and checks its pins
# against pyproject.toml and its COPY sources against the repository.
#
# What is pinned, and why:
#   base     nvidia/cuda 13.0.1 devel: torch 2.13.0's CUDA wheels are CUDA 13.0 builds (the PyPI wheel
#            depends on cuda-toolkit 13.0.3), and DeepSpeed JIT-compiles its ops (CPU Adam for optimizer
#            offload, fused Adam) with nvcc and the CUDA headers on first use.
#   python   3.11 (pyproject: >=3.11,<3.12); Ubuntu 24.04 ships 3.12, so it comes from the deadsnakes PPA.
#   learner  torch 2.13.0 from the PyTorch cu130 index, deepspeed 0.19.0, peft 0.21.2, transformers
#            5.24.0: the pyproject.toml pins (the test keeps them equal).
#   rollout  sglang 0.5.21, the last release on torch 2.13.0 (0.5.22 and 0.5.23 require torch 2.14.1).
#            It also pins transformers 5.12.1 against swerl's 5.24.0, so it lives in its own venv; swerl
#            only talks to it over HTTP. Point swerl at it: `rollout.engine=sglang
#            rollout.sglang.python=/opt/sglang-venv/bin/python`.
#   docker   the static CLI build 27.5.1; the engine is the host's (below).
#
# Build:  docker build -t swerl-trainer .
# Run:    the trainer starts sandbox containers on the host's Docker engine, so mount its socket and add
#         the socket's group (its gid differs between hosts) to the non-root user:
#   docker run --gpus all --ipc=host --ulimit memlock=-1 \
#       -v /var/run/docker.sock:/var/run/docker.sock --group-add "$(stat -c %g /var/run/docker.sock)" \
#       -v "$PWD/runs:/opt/swerl/runs" -v /path/to/models:/models:ro \
#       swerl-trainer train --config configs/<size>.yaml run_dir=runs/x
# The sandbox base image (`swerl sandbox build-base`, debootstrap as root) is built on the host once.
FROM nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04

ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Distribution packages follow the base image's archive snapshot; pinning their versions would break
# the build each time Ubuntu or the PPA retires one. build-essential and python3.11-dev: DeepSpeed's
# JIT op builds need a host compiler and Python.h.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gpg-agent software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential git \
 && rm -rf /var/lib/apt/lists/*

ARG DOCKER_CLI_VERSION=27.5.1
RUN curl -fsSL "https://download.docker.com/linux/static/stable/x86_64/docker-${DOCKER_CLI_VERSION}.tgz" \
    | tar -xz -C /usr/local/bin --strip-components=1 docker/docker \
 && docker --version

# The heavy, source-independent installs first, so editing swerl does not rebuild them.
RUN python3.11 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0 \
 && /opt/venv/bin/pip install --no-cache-dir deepspeed==0.19.0 peft==0.21.2 transformers==5.24.0

RUN python3.11 -m venv /opt/sglang-venv \
 && /opt/sglang-venv/bin/pip install --no-cache-dir sglang==0.5.21

# A fixed numeric id (Ubuntu's image already has uid 1000, `ubuntu`), so USER needs no name lookup.
RUN groupadd --gid 1001 swerl && useradd --create-home --shell /bin/bash --uid 1001 --gid 1001 swerl
WORKDIR /opt/swerl
# swerl finds sandbox/, tasks/ and its .cache/ next to its source, hence the editable install here.
COPY --chown=1001:1001 pyproject.toml README.md LICENSE ./
COPY --chown=1001:1001 swerl ./swerl
COPY --chown=1001:1001 sandbox ./sandbox
COPY --chown=1001:1001 tasks ./tasks
COPY --chown=1001:1001 configs ./configs
COPY --chown=1001:1001 scripts ./scripts
RUN /opt/venv/bin/pip install --no-cache-dir -e . \
 && mkdir -p /opt/swerl/runs /opt/swerl/.cache \
 && chown -R 1001:1001 /opt/swerl

# Hopper (H100 / H200) for DeepSpeed's JIT op builds; add 10.0 for Blackwell.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TORCH_CUDA_ARCH_LIST=9.0 \
    HF_HOME=/home/swerl/.cache/huggingface
USER 1001:1001
ENTRYPOINT ["swerl"]
CMD ["--help"]
