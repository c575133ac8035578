# swerl base image, second stage: turns a root filesystem (debootstrap, or an official python image)
# into a sandbox base. ${FROM} is filled in by `swerl sandbox build-base`.
FROM ${FROM}
# A non-root user for the agent; the harness reads the label to run sessions as it.
RUN (getent passwd swerl || useradd --create-home --uid 1000 --shell /bin/bash swerl) \
 && mkdir -p /testbed && chown swerl:swerl /testbed \
 && git config --system user.name swerl && git config --system user.email swerl@localhost \
 && git config --system safe.directory '*' && git config --system init.defaultBranch main
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1
WORKDIR /testbed
LABEL swerl.user=swerl
# Sandboxes hold no state worth a graceful stop; SIGKILL avoids a 10 s wait on every removal.
STOPSIGNAL SIGKILL
CMD ["/bin/bash"]
