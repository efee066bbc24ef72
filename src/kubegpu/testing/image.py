"""Build kubegpu's image without a registry and load it into the test containerd (the node tier).

No base image can be pulled on these machines, so the Dockerfile's `BASE_IMAGE` is a Debian bookworm root file system
made with debootstrap from Debian's own packages (the mirror apt uses; Debian 12's python3 is 3.11) and committed with
`buildah from scratch`. buildah then builds the unmodified Dockerfile (`bud --isolation chroot --pull=never`; pip
inside the build reaches PyPI), exports it as a docker-archive, and `ctr -n k8s.io images import` loads it where the
kubelet finds it (pods use the chart's tag with `IfNotPresent`, or `imagePullPolicy: Never`).

Everything is cached outside the checkout, in `${XDG_CACHE_HOME:-~/.cache}/kubegpu/image`: the debootstrap tarball
(keyed by suite, mirror and packages) and the exported image (keyed by a hash of every build input: the Dockerfile,
.dockerignore, pyproject.toml, README.md, src/, deploy/crds/ and the base). An unchanged checkout therefore builds
nothing, and a loaded image carrying the same hash label is not imported again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kubegpu import __version__
from kubegpu.errors import KubegpuError
from kubegpu.testing import k8sbuild

log = logging.getLogger("kubegpu.testing.image")

SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REF = f"localhost/kubegpu-base:{SUITE}"
IMAGE_REPOSITORY = "ghcr.io/kubegpu/kubegpu"
IMAGE_REF = f"{IMAGE_REPOSITORY}:{__version__}"  # the chart's default image (appVersion)
INPUTS_LABEL = "kubegpu.io/build-inputs"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("buildah", "debootstrap")  # what `scripts/build-image.sh` installs with apt-get
KEEP_ARCHIVES = 2
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's path, in the base as on the host
PIP_CONF = "/etc/pip.conf"
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Built:
    ref: str
    archive: Path
    inputs: str  # the hash of the build inputs
    seconds: float
    cached: bool


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def cache_dir() -> Path:
    return k8sbuild.cache_root().parent / "image"


def _run(args: list[str], what: str, timeout: float = BUILD_TIMEOUT_S, cwd: Path | None = None) -> str:
    """Run a tool; a failure is one line: what failed and the tool's last words."""
    if shutil.which(args[0]) is None and not Path(args[0]).is_file():
        raise KubegpuError(f"{what}: `{args[0]}` is not installed (scripts/build-image.sh installs "
                           f"{' '.join(DEBIAN_PACKAGES)} with apt-get)")
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise KubegpuError(f"{what}: ran longer than {timeout:.0f}s") from None
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        # buildah ends with "subprocess exited with status 1"; the cause (pip's ERROR lines) is further up
        errors = [line for line in lines if "error" in line.lower() and "exited with status" not in line]
        raise KubegpuError(f"{what}: {' | '.join((errors or lines)[-3:]) or f'exit status {result.returncode}'}")
    return result.stdout


def apt_mirror(sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> str:
    """The Debian mirror apt itself uses (deb822 `URIs:` of the stanza with this suite), else deb.debian.org."""
    try:
        text = sources.read_text()
    except OSError:
        return DEFAULT_MIRROR
    for stanza in re.split(r"\n\s*\n", text):
        uris = re.search(r"^URIs:\s*(\S+)", stanza, re.MULTILINE)
        suites = re.search(r"^Suites:\s*(.+)$", stanza, re.MULTILINE)
        if uris and suites and SUITE in suites.group(1).split():
            return uris.group(1).rstrip("/")
    return DEFAULT_MIRROR


def _image_id(ref: str) -> str | None:
    result = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
                            capture_output=True, text=True, check=False)
    return result.stdout.strip() or None if result.returncode == 0 else None


def base_image(mirror: str | None = None) -> str:
    """BASE_REF in buildah's store, made from a cached debootstrap tarball (made first when missing)."""
    existing = _image_id(BASE_REF)
    if existing:
        return existing
    mirror = mirror or apt_mirror()
    key = hashlib.sha256(f"{SUITE} {mirror} {' '.join(BASE_PACKAGES)} minbase".encode()).hexdigest()[:12]
    tarball = cache_dir() / f"base-{SUITE}-{key}.tar"
    if not tarball.is_file():
        cache_dir().mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="debootstrap-", dir=cache_dir()) as scratch:
            root = Path(scratch) / "rootfs"
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(root),
                  mirror], f"debootstrap {SUITE} from {mirror}")
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):  # 100+ MB of downloads, not the OS
                for entry in (root / leftover).glob("*"):
                    if entry.is_file():
                        entry.unlink()
            partial = tarball.with_name(tarball.name + ".partial")
            _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], "tar the base root")
            partial.replace(tarball)
        log.info("debootstrap %s base in %.0fs (%s)", SUITE, time.monotonic() - started, tarball)
    container = _run(["buildah", "from", "scratch"], "buildah from scratch").strip()
    try:
        _run(["buildah", "add", container, str(tarball), "/"], "buildah add the base root")
        _run(["buildah", "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--env", "LANG=C.UTF-8", "--cmd", "/bin/sh", container], "buildah config the base")
        _run(["buildah", "commit", "--rm", container, BASE_REF], "buildah commit the base")
    except KubegpuError:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    image = _image_id(BASE_REF)
    if image is None:
        raise KubegpuError(f"{BASE_REF}: committed but not found in buildah's store")
    return image


def _host_trust() -> list[str]:
    """This host's CA bundle and pip config, mounted into the build's RUN steps only (buildah `-v`: never part of
    the image), so pip reaches PyPI through a TLS-intercepting proxy the host trusts."""
    bundle = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or HOST_CA_BUNDLE)
    args = []
    if bundle.is_file():
        args += ["-v", f"{bundle.resolve()}:{HOST_CA_BUNDLE}:ro"]
    if Path(PIP_CONF).is_file():
        args += ["-v", f"{PIP_CONF}:{PIP_CONF}:ro"]
    return args


def _context_files(root: Path) -> list[Path]:
    """What the Dockerfile's context holds after .dockerignore (its allow-list), plus the Dockerfile itself."""
    files = [root / name for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")]
    testing = root / "src" / "kubegpu" / "testing"  # excluded by .dockerignore: test helpers only
    for top in ("src", "deploy/crds"):
        files += [p for p in (root / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc" and testing not in p.parents]
    return sorted(files)


def inputs_hash(root: Path, base_id: str) -> str:
    digest = hashlib.sha256(f"base {base_id}\n".encode())
    for path in _context_files(root):
        digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build(root: Path | None = None, ref: str = IMAGE_REF, force: bool = False) -> Built:
    """The image's docker-archive for the current inputs: from the cache, or built now."""
    root = root or repo_root()
    started = time.monotonic()
    base = base_image()
    inputs = inputs_hash(root, base)
    archive = cache_dir() / f"kubegpu-{inputs}.tar"
    if archive.is_file() and not force:
        return Built(ref, archive, inputs, time.monotonic() - started, cached=True)
    _run(["buildah", "bud", "--isolation", "chroot", "--pull=never", "--build-arg", f"BASE_IMAGE={BASE_REF}",
          *_host_trust(), "--label", f"{INPUTS_LABEL}={inputs}", "-t", ref, "-f", str(root / "Dockerfile"),
          str(root)], f"buildah bud {root / 'Dockerfile'}")
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    _run(["buildah", "push", ref, f"docker-archive:{partial}:{ref}"], f"buildah push {ref} to a docker-archive")
    partial.replace(archive)
    _prune(archive)
    # the image this tag named before is now dangling in buildah's store (~500 MB each build): drop it
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, check=False)
    return Built(ref, archive, inputs, time.monotonic() - started, cached=False)


def _prune(keep: Path) -> None:
    """Keep the newest archives only (each is ~600 MB)."""
    archives = sorted(cache_dir().glob("kubegpu-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [a for a in archives if a != keep][KEEP_ARCHIVES - 1:]:
        old.unlink(missing_ok=True)


def load(built: Built, containerd_socket: Path, ctr: Path | str = "ctr") -> bool:
    """Import into containerd's CRI namespace unless an image of the same inputs is already there; True when
    imported."""
    base = [str(ctr), f"--address={containerd_socket}", "--namespace=k8s.io"]
    listed = _run([*base, "images", "ls", f"name=={built.ref}"], f"ctr images ls on {containerd_socket}", 60)
    if f"{INPUTS_LABEL}={built.inputs}" in listed:
        return False
    _run([*base, "images", "import", str(built.archive)], f"ctr images import {built.archive}", 600)
    _run([*base, "images", "label", built.ref, f"{INPUTS_LABEL}={built.inputs}"], f"ctr images label {built.ref}", 60)
    return True


def main(argv: list[str] | None = None) -> int:
    """`scripts/build-image.sh [--force] [--load CONTAINERD_SOCKET [--ctr PATH]]`: prints the archive's path."""
    import argparse

    parser = argparse.ArgumentParser(prog="build-image.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="build even when the cache holds these inputs")
    parser.add_argument("--ref", default=IMAGE_REF, help=f"the image's name (default {IMAGE_REF})")
    parser.add_argument("--load", metavar="SOCKET", type=Path, help="containerd socket to import the image into")
    parser.add_argument("--ctr", default=os.environ.get("CTR", "ctr"), help="the ctr binary (default: on PATH)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        built = build(ref=args.ref, force=args.force)
        how = "cached" if built.cached else "built"
        log.info("image %s %s in %.0fs (inputs %s)", built.ref, how, built.seconds, built.inputs)
        if args.load is not None:
            began = time.monotonic()
            imported = load(built, args.load, args.ctr)
            log.info("%s into %s in %.0fs", "imported" if imported else "already loaded", args.load,
                     time.monotonic() - began)
    except KubegpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(built.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
