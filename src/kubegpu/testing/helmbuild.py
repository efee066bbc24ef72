"""Build the Helm CLI from Helm's Go module, once per pinned version, like the Kubernetes binaries (k8sbuild).

test/helm/go.mod is the one place Helm is pinned. The binary goes to `${XDG_CACHE_HOME:-~/.cache}/kubegpu/helm/<helm
version>/bin/helm` with a stamp of the go.mod/go.sum it came from (`build.json`), so a second build — or a fresh clone
on the same machine — reuses it. `python -m kubegpu.testing.helmbuild` builds it and prints its path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.testing import k8sbuild

log = logging.getLogger("kubegpu.testing.build")

HELM_MODULE = "helm.sh/helm/v4"
HELM_PACKAGE = f"{HELM_MODULE}/cmd/helm"
STAMP = "build.json"


def module_dir() -> Path:
    """test/helm in this checkout (or $KUBEGPU_HELM_MODULE)."""
    override = os.environ.get("KUBEGPU_HELM_MODULE")
    path = Path(override) if override else k8sbuild.module_dir().parent / "helm"
    if not (path / "go.mod").is_file():
        raise KubegpuError(f"{path / 'go.mod'}: not found; Helm builds from a kubegpu checkout "
                           "(set KUBEGPU_HELM_MODULE to its test/helm directory)")
    return path


def read_version(go_mod: Path | None = None) -> str:
    go_mod = go_mod or module_dir() / "go.mod"
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(HELM_MODULE)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise KubegpuError(f"{go_mod}: no `require {HELM_MODULE} vX.Y.Z` line")
    return match.group(1)


def binary(version: str | None = None) -> Path:
    """Where the pinned (or given) Helm's binary lives."""
    return k8sbuild.cache_root().parent / "helm" / (version or read_version()) / "bin" / "helm"


def _ldflags(version: str) -> str:
    """Stamp the version `helm version` reports (its Makefile's -X flags) and strip symbols."""
    return f"-s -w -X {HELM_MODULE}/internal/version.version={version} " \
           f"-X {HELM_MODULE}/internal/version.gitTreeState=clean"


def _fingerprint(module: Path, version: str) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "tools.go"):
        path = module / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    digest.update(_ldflags(version).encode())
    return digest.hexdigest()[:16]


def is_built() -> bool:
    module = module_dir()
    version = read_version(module / "go.mod")
    helm = binary(version)
    try:
        stamp = json.loads((helm.parent / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return helm.is_file() and stamp.get("fingerprint") == _fingerprint(module, version)


def build(force: bool = False) -> Path:
    """Build Helm when missing or stale (always with `force`); return the binary's path."""
    module = module_dir()
    version = read_version(module / "go.mod")
    helm = binary(version)
    if not force and is_built():
        log.info("helm %s: reusing %s", version, helm)
        return helm
    helm.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    k8sbuild._run_go(["mod", "download", HELM_MODULE], module, "go mod download (helm)")
    partial = helm.with_name(".helm.partial")
    k8sbuild._run_go(["build", "-p", k8sbuild.GO_BUILD_PARALLELISM, "-trimpath", f"-ldflags={_ldflags(version)}",
                      "-o", str(partial), HELM_PACKAGE], module, "go build helm")
    partial.replace(helm)
    seconds = round(time.monotonic() - started, 1)
    (helm.parent / STAMP).write_text(json.dumps({"fingerprint": _fingerprint(module, version), "helm": version,
                                                 "seconds": seconds}, indent=2) + "\n")
    log.info("built helm %s in %.0fs", version, seconds)
    return helm


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        print(build(force="--force" in args))
    except KubegpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
