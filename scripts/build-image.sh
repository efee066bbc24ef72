#!/usr/bin/env bash
# Build kubegpu's image with buildah, without a registry, and optionally load it into a containerd (docs/testing.md):
#   scripts/build-image.sh                         build (or reuse) the image; prints its docker-archive
#   scripts/build-image.sh --load SOCKET [--ctr CTR]  ... and import it into that containerd (namespace k8s.io)
# The base is Debian bookworm made with debootstrap; both are cached in ~/.cache/kubegpu/image (by content hash).
# The logic lives in kubegpu.testing.image.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; fi
if ! command -v buildah >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends buildah debootstrap >/dev/null
fi
exec "$PYTHON" -m kubegpu.testing.image "$@"
