# swerl task image: the base image + a repository at /testbed + its Python dependencies, installed
# from wheels downloaded on the host (the build runs with --network none). Rendered by
# swerl.sandbox.images.build_task_image (string.Template: dollar-brace names are filled in, $$ is a literal dollar).
FROM ${BASE}
COPY --chown=swerl:swerl repo/ /testbed/
COPY wheels/ /opt/swerl-wheels/
USER root
RUN set -e; \
    if ls /opt/swerl-wheels/*.whl >/dev/null 2>&1; then \
      pip=$$(ls /opt/swerl-wheels/pip-*.whl | head -1); \
      python3 "$$pip/pip" install --no-index --no-cache-dir --break-system-packages --root-user-action=ignore \
        --find-links /opt/swerl-wheels ${REQUIREMENTS}; \
    fi; \
    rm -rf /opt/swerl-wheels
USER swerl
RUN set -e; cd /testbed; \
    if [ ! -d .git ]; then \
      git init -q && git add -A \
      && GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z git commit -q -m base; \
    fi
${SETUP}
USER root
LABEL swerl.user=swerl swerl.task=${NAME} swerl.content-hash=${HASH}
STOPSIGNAL SIGKILL
