"""Build the real control plane's binaries from Kubernetes' published Go modules, once per pinned version.

`k8s.io/kubernetes` cannot be `go install`ed (its go.mod replaces the staging modules with local paths), so the tools
module in `test/k8s/` requires it and replaces every `k8s.io/*` staging module with its `v0.X.Y` release; its go.mod
is the one file that pins Kubernetes, etcd and kwok. Binaries go to `${XDG_CACHE_HOME:-~/.cache}/kubegpu/k8s/<k8s
version>/bin` with a stamp of the go.mod/go.sum they came from, so a second build — or a fresh clone on the same
machine — reuses them; Go's own module and build caches (outside the checkout too) make a rebuild after a bump cheap.
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

log = logging.getLogger("kubegpu.testing.build")

KUBERNETES_MODULE = "k8s.io/kubernetes"
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
KWOK_MODULE = "sigs.k8s.io/kwok"
# binary name -> Go main package
PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "etcd": ETCD_MODULE,
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
}
BINARIES = tuple(PACKAGES)
# kwok ships its stages (node initialise/heartbeat, pod ready/complete/delete) as YAML in its module; `build` copies
# them next to the binaries so `up` needs no Go module cache.
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_STAGES = "kwok-stages.yaml"
STAMP = "build.json"
GATES_CACHE = "feature-gates.txt"  # written by the first `up` (controlplane._start_apiserver)
GO_BUILD_PARALLELISM = "2"
GO_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str


def module_dir() -> Path:
    """test/k8s in this checkout (or $KUBEGPU_K8S_MODULE)."""
    override = os.environ.get("KUBEGPU_K8S_MODULE")
    path = Path(override) if override else Path(__file__).resolve().parents[3] / "test" / "k8s"
    if not (path / "go.mod").is_file():
        raise KubegpuError(f"{path / 'go.mod'}: not found; the control plane builds from a kubegpu checkout "
                           "(set KUBEGPU_K8S_MODULE to its test/k8s directory)")
    return path


def read_versions(go_mod: Path) -> Versions:
    """The pinned versions, read from the tools module's require block."""
    text = go_mod.read_text()
    found: dict[str, str] = {}
    for module in (KUBERNETES_MODULE, ETCD_MODULE, KWOK_MODULE):
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
        if match is None:
            raise KubegpuError(f"{go_mod}: no `require {module} vX.Y.Z` line")
        found[module] = match.group(1)
    return Versions(found[KUBERNETES_MODULE], found[ETCD_MODULE], found[KWOK_MODULE])


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kubegpu" / "k8s"


def bin_dir(versions: Versions | None = None) -> Path:
    """Where the binaries of the pinned (or given) versions live."""
    versions = versions or read_versions(module_dir() / "go.mod")
    return cache_root() / versions.kubernetes / "bin"


def _fingerprint(module: Path, versions: Versions) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "tools.go"):
        path = module / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    digest.update(_ldflags(versions).encode())
    return digest.hexdigest()[:16]


def _ldflags(versions: Versions) -> str:
    """Strip symbols and stamp the Kubernetes version the binaries report (clients and skew checks read it)."""
    major, minor = versions.kubernetes.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (f"-s -w -X {pkg}.gitVersion={versions.kubernetes} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} "
            f"-X {pkg}.gitTreeState=clean")


def missing_binaries(directory: Path | None = None) -> list[str]:
    """The binaries (and kwok stages) not yet built; empty when `up` can run."""
    directory = directory or bin_dir()
    names = [*BINARIES, KWOK_STAGES]
    return [name for name in names if not (directory / name).is_file()]


def is_built(directory: Path | None = None) -> bool:
    """True when every binary is present and stamped by a build of the current go.mod/go.sum."""
    module = module_dir()
    versions = read_versions(module / "go.mod")
    directory = directory or bin_dir(versions)
    if missing_binaries(directory):
        return False
    try:
        stamp = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("fingerprint") == _fingerprint(module, versions))


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise KubegpuError("Go is not installed or not on PATH: building the control plane needs Go >= 1.26 "
                           "(https://go.dev/dl/)")
    return go


def _go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
    env.update(extra or {})
    return env


_PROXY_FAILURE = re.compile(r"dial tcp|no such host|i/o timeout|connection refused|GOPROXY|proxy\.golang|"
                            r"TLS handshake|network is unreachable|module lookup disabled|403 Forbidden|"
                            r"verifying module", re.IGNORECASE)


def _run_go(args: list[str], module: Path, what: str, env: dict[str, str] | None = None) -> str:
    try:
        result = subprocess.run([_go(), *args], cwd=module, env=_go_env(env), capture_output=True, text=True,
                                timeout=GO_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise KubegpuError(f"{what}: `go {' '.join(args[:2])}` ran longer than {GO_TIMEOUT_S}s") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        tail = " | ".join(lines[-3:]) or f"exit status {result.returncode}"
        if args[:2] == ["mod", "download"] or _PROXY_FAILURE.search(result.stderr):
            proxy = os.environ.get("GOPROXY") or "https://proxy.golang.org,direct (default)"
            raise KubegpuError(f"{what}: cannot fetch modules from the Go module proxy (GOPROXY={proxy}): {tail}")
        raise KubegpuError(f"{what}: {tail}")
    return result.stdout


def build(force: bool = False) -> Path:
    """Build what is missing or stale (all of it when ``force``); return the directory holding the binaries."""
    module = module_dir()
    versions = read_versions(module / "go.mod")
    directory = bin_dir(versions)
    if not force and is_built(directory):
        log.info("control plane %s: reusing binaries in %s", versions.kubernetes, directory)
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("control plane: Kubernetes %s, etcd %s, kwok %s -> %s", versions.kubernetes, versions.etcd,
             versions.kwok, directory)
    _run_go(["mod", "download", KUBERNETES_MODULE, ETCD_MODULE, KWOK_MODULE], module, "go mod download")
    log.info("modules ready in %.0fs", time.monotonic() - started)
    for name, package in PACKAGES.items():
        began = time.monotonic()
        partial = directory / f".{name}.partial"
        _run_go(["build", "-p", GO_BUILD_PARALLELISM, "-trimpath", f"-ldflags={_ldflags(versions)}",
                 "-o", str(partial), package], module, f"go build {name}")
        partial.replace(directory / name)
        log.info("built %s in %.0fs", name, time.monotonic() - began)
    _write_kwok_stages(module, directory)
    (directory / GATES_CACHE).unlink(missing_ok=True)
    (directory / STAMP).write_text(json.dumps({
        "fingerprint": _fingerprint(module, versions), "kubernetes": versions.kubernetes, "etcd": versions.etcd,
        "kwok": versions.kwok, "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
    log.info("control plane binaries built in %.0fs", time.monotonic() - started)
    return directory


def _write_kwok_stages(module: Path, directory: Path) -> None:
    source = Path(_run_go(["list", "-m", "-f", "{{.Dir}}", KWOK_MODULE], module, "go list kwok").strip())
    documents = []
    for relative in KWOK_STAGE_FILES:
        path = source / relative
        if not path.is_file():
            raise KubegpuError(f"{path}: kwok stage not found in the kwok module; check KWOK_STAGE_FILES")
        documents.append(path.read_text().strip() + "\n")
    (directory / KWOK_STAGES).write_text("---\n".join(documents))
