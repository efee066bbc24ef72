"""Build the real node's binaries and images once per pinned version: the kubelet (the pinned Kubernetes of
test/k8s), containerd + ctr + containerd-shim-runc-v2 and runc (pinned in test/node/go.mod), a static pause
process, and the two images of `kubegpu.testing.nodeimages`.

They go to `${XDG_CACHE_HOME:-~/.cache}/kubegpu/node/<kubernetes>-containerd-<v>-runc-<v>/bin` with a stamp of
their own (`build.json`), separate from the control plane's: the kubelet's import sits in test/k8s/tools_node.go, so
adding or bumping the node set never invalidates the control plane's stamp, and a cache hit takes a second. The
kubelet shares Go's build cache with the control plane, so a cold kubelet build after the control plane is minutes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kubegpu.errors import KubegpuError
from kubegpu.testing import k8sbuild, nodeimages

log = logging.getLogger("kubegpu.testing.build")

CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
RUNC_MODULE = "github.com/opencontainers/runc"
KUBELET_PACKAGE = "k8s.io/kubernetes/cmd/kubelet"
CONTAINERD_PACKAGES = {
    "containerd": f"{CONTAINERD_MODULE}/cmd/containerd",
    "ctr": f"{CONTAINERD_MODULE}/cmd/ctr",
    "containerd-shim-runc-v2": f"{CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2",
}
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"
BINARIES = ("kubelet", *CONTAINERD_PACKAGES, "runc", "pause")
IMAGES = (nodeimages.TEST_TAR, nodeimages.PAUSE_TAR)
STAMP = "build.json"
NODE_TOOLS = "tools_node.go"  # in test/k8s: the kubelet's import, outside the control plane's fingerprint
# Debian packages the build and `up --real-node` need (`.ci/run` installs them)
DEBIAN_PACKAGES = ("gcc", "libc6-dev", "pkg-config", "libseccomp-dev", "busybox-static", "containernetworking-plugins")


@dataclass(frozen=True)
class NodeVersions:
    kubernetes: str
    containerd: str
    runc: str


def module_dir() -> Path:
    """test/node in this checkout (or $KUBEGPU_NODE_MODULE)."""
    override = os.environ.get("KUBEGPU_NODE_MODULE")
    path = Path(override) if override else k8sbuild.module_dir().parent / "node"
    if not (path / "go.mod").is_file():
        raise KubegpuError(f"{path / 'go.mod'}: not found; the real node builds from a kubegpu checkout "
                           "(set KUBEGPU_NODE_MODULE to its test/node directory)")
    return path


def read_versions() -> NodeVersions:
    kubernetes = k8sbuild.read_versions(k8sbuild.module_dir() / "go.mod").kubernetes
    go_mod = module_dir() / "go.mod"
    text = go_mod.read_text()
    found = {}
    for module in (CONTAINERD_MODULE, RUNC_MODULE):
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
        if match is None:
            raise KubegpuError(f"{go_mod}: no `require {module} vX.Y.Z` line")
        found[module] = match.group(1)
    return NodeVersions(kubernetes, found[CONTAINERD_MODULE], found[RUNC_MODULE])


def node_dir(versions: NodeVersions | None = None) -> Path:
    """Where the binaries (bin/) and images (images/) of the pinned node set live."""
    versions = versions or read_versions()
    name = f"{versions.kubernetes}-containerd-{versions.containerd}-runc-{versions.runc}"
    return k8sbuild.cache_root().parent / "node" / name


def bin_dir(versions: NodeVersions | None = None) -> Path:
    return node_dir(versions) / "bin"


def images_dir(versions: NodeVersions | None = None) -> Path:
    return node_dir(versions) / "images"


def missing(directory: Path | None = None) -> list[str]:
    """What `up --real-node` needs and the cache lacks (binaries, then images); empty when it can run."""
    directory = directory or node_dir()
    absent = [name for name in BINARIES if not (directory / "bin" / name).is_file()]
    return absent + [name for name in IMAGES if not (directory / "images" / name).is_file()]


def _fingerprint(versions: NodeVersions) -> str:
    digest = hashlib.sha256()
    k8s, node = k8sbuild.module_dir(), module_dir()
    inputs = [k8s / "go.mod", k8s / "go.sum", k8s / NODE_TOOLS, node / "go.mod", node / "go.sum", node / "tools.go",
              node / "pause.c"]
    for path in inputs:
        digest.update(str(path.name).encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    busybox = nodeimages.BUSYBOX
    digest.update(hashlib.sha256(busybox.read_bytes()).digest() if busybox.is_file() else b"no busybox")
    digest.update(f"{versions}|{nodeimages.FORMAT}|{CONTAINERD_TAGS}".encode())
    return digest.hexdigest()[:16]


def is_built(directory: Path | None = None) -> bool:
    versions = read_versions()
    directory = directory or node_dir(versions)
    if missing(directory):
        return False
    try:
        stamp = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("fingerprint") == _fingerprint(versions))


def check_prerequisites() -> None:
    """The host tools the node build needs, named as Debian packages in one line when any is missing."""
    absent = []
    if shutil.which("gcc") is None:
        absent.append("gcc")
    if shutil.which("pkg-config") is None:
        absent.append("pkg-config")
    elif subprocess.run(["pkg-config", "--exists", "libseccomp"], check=False).returncode != 0:
        absent.append("libseccomp-dev")
    if not nodeimages.BUSYBOX.is_file():
        absent.append("busybox-static")
    if absent:
        raise KubegpuError(f"the real node's build needs {', '.join(absent)}: "
                           f"apt-get install {' '.join(DEBIAN_PACKAGES)}")


def build(force: bool = False) -> Path:
    """Build what is missing or stale (all when ``force``); return the node directory (bin/, images/)."""
    versions = read_versions()
    directory = node_dir(versions)
    if not force and is_built(directory):
        log.info("real node %s: reusing %s", versions, directory)
        return directory
    check_prerequisites()
    bins, images = directory / "bin", directory / "images"
    bins.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    k8s, node = k8sbuild.module_dir(), module_dir()
    log.info("real node: kubelet %s, containerd %s, runc %s -> %s", versions.kubernetes, versions.containerd,
             versions.runc, directory)
    k8sbuild._run_go(["mod", "download", CONTAINERD_MODULE, RUNC_MODULE], node, "go mod download (node)")
    timings: dict[str, float] = {}
    kube_flags = k8sbuild._ldflags(k8sbuild.read_versions(k8s / "go.mod"))
    _go_build(bins, "kubelet", KUBELET_PACKAGE, k8s, ["-trimpath", f"-ldflags={kube_flags}"], None, timings)
    containerd_flags = f"-s -w -X {CONTAINERD_MODULE}/version.Version={versions.containerd}"
    for name, package in CONTAINERD_PACKAGES.items():
        _go_build(bins, name, package, node, ["-trimpath", f"-tags={CONTAINERD_TAGS}", f"-ldflags={containerd_flags}"],
                  {"CGO_ENABLED": "0"}, timings)
    runc_flags = f"-s -w -X main.version={versions.runc.lstrip('v')}"
    _go_build(bins, "runc", RUNC_MODULE, node, ["-trimpath", "-tags=seccomp", f"-ldflags={runc_flags}"],
              {"CGO_ENABLED": "1"}, timings)
    _build_pause(node / "pause.c", bins / "pause")
    nodeimages.build_test_image(images / nodeimages.TEST_TAR)
    nodeimages.build_pause_image(images / nodeimages.PAUSE_TAR, bins / "pause")
    (directory / STAMP).write_text(json.dumps({
        "fingerprint": _fingerprint(versions), "kubernetes": versions.kubernetes, "containerd": versions.containerd,
        "runc": versions.runc, "seconds": round(time.monotonic() - started, 1), "binaries": timings}, indent=2) + "\n")
    log.info("real node binaries and images built in %.0fs", time.monotonic() - started)
    return directory


def _go_build(bins: Path, name: str, package: str, module: Path, flags: list[str], env: dict[str, str] | None,
              timings: dict[str, float]) -> None:
    began = time.monotonic()
    partial = bins / f".{name}.partial"
    k8sbuild._run_go(["build", "-p", k8sbuild.GO_BUILD_PARALLELISM, *flags, "-o", str(partial), package], module,
                     f"go build {name}", env)
    partial.replace(bins / name)
    timings[name] = round(time.monotonic() - began, 1)
    log.info("built %s in %.0fs", name, timings[name])


def _build_pause(source: Path, target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    result = subprocess.run(["gcc", "-static", "-O2", "-o", str(partial), str(source)], capture_output=True,
                            text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise KubegpuError(f"gcc -static {source}: {result.stderr.strip().splitlines()[-1:] or result.returncode} "
                           "(needs gcc and libc6-dev)")
    partial.replace(target)
