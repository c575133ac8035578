# swerl trainer image for GPU clusters. It cannot be built where no registry is reachable (CI here);
# the learner milestone pins deepspeed / sglang in it. Build: docker build -t swerl-trainer .
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv git docker.io \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/swerl
COPY pyproject.toml README.md ./
COPY swerl ./swerl
COPY sandbox ./sandbox
RUN python3.11 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir torch==2.13.0 \
 && /opt/venv/bin/pip install --no-cache-dir -e .
ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["swerl"]
