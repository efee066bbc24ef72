# One image for every kubegpu component; `kubegpu <command>` picks the component (see README's table).
# Build: docker build -t ghcr.io/kubegpu/kubegpu:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/kubegpu/venv \
    && /opt/kubegpu/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="kubegpu" \
      org.opencontainers.image.description="Shareable, fully used GPUs in Kubernetes: all components in one image" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/kubegpu/venv /opt/kubegpu/venv
# The operator server-side-applies these at start, so `helm upgrade` never leaves a stale CRD.
COPY deploy/crds /opt/kubegpu/crds
RUN groupadd --system --gid 65532 kubegpu \
    && useradd --system --uid 65532 --gid kubegpu --home-dir /nonexistent --shell /usr/sbin/nologin kubegpu
ENV PATH="/opt/kubegpu/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Node agents that need root (device plugin, MIG manager, validator) ask for it in their pod securityContext.
USER 65532:65532
ENTRYPOINT ["kubegpu"]
CMD ["--help"]
