# One image for every kubegpu component; `kubegpu <command>` picks the component (see README's table).
# Build: docker build -t ghcr.io/kubegpu/kubegpu:0.1.0 .
# Without a registry (no python:3.11-slim to pull): scripts/build-image.sh builds it with buildah on a Debian
# bookworm base made with debootstrap (BASE_IMAGE; Debian 12's python3 is 3.11) and loads it into containerd.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python3 -m venv /opt/kubegpu/venv \
    && /opt/kubegpu/venv/bin/pip install --no-cache-dir .

FROM ${BASE_IMAGE}
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
