# Root filesystem from a registry, used by `swerl sandbox build-base` when one is reachable.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git patch procps \
 && rm -rf /var/lib/apt/lists/*
