"""The two container images of the real-node tier, built locally because no registry is reachable here.

A one-layer docker-archive tar (the format `docker save` writes: `manifest.json` naming the tags, the image config
and `layer.tar`) is what `ctr -n k8s.io images import` loads into containerd's CRI namespace, after which the kubelet
sees the image as present — so pods run it with `imagePullPolicy: IfNotPresent` or `Never`. The test image is the
Debian `busybox-static` binary with one symlink per applet (`sh`, `env`, `ls`, `grep`, `sleep`, `cat`, ...); the
pause image is the static sandbox process built from test/node/pause.c.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.errors import KubegpuError

# Tags are not `latest`, so the kubelet's default pull policy for them is IfNotPresent and it never tries a registry.
TEST_IMAGE = "kubegpu.local/busybox:1"
TEST_IMAGE_ALIASES = ("docker.io/library/busybox:1.36",)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
TEST_TAR = "test-image.tar"
PAUSE_TAR = "pause-image.tar"
BUSYBOX = Path("/bin/busybox")
FORMAT = "1"  # bump when the image layout changes, so a build stamp made before is stale
_EPOCH = 0  # file times in the layer: fixed, so the same inputs give the same image digest


@dataclass(frozen=True)
class Entry:
    """One file of a layer: a regular file (``data``), a symlink (``link``) or a directory (neither)."""

    name: str
    data: bytes | None = None
    link: str | None = None
    mode: int = 0o755


def go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _layer(entries: list[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mtime, info.mode, info.uid, info.gid = _EPOCH, entry.mode, 0, 0
            if entry.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buffer.getvalue()


def docker_archive(target: Path, tags: list[str], entries: list[Entry], config: Mapping[str, object]) -> Path:
    """Write a one-layer docker-archive tar holding ``entries`` tagged ``tags``; ``config`` is the image's runtime
    config (Env, Cmd, Entrypoint). Written under a temporary name and renamed, so a reader never sees half."""
    layer = _layer(entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = json.dumps({
        "architecture": go_arch(), "os": "linux", "created": "1970-01-01T00:00:00Z", "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kubegpu.testing.nodeimages"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(image_config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": tags, "Layers": ["layer/layer.tar"]}]).encode()
    partial = target.with_name(f".{target.name}.partial")
    with tarfile.open(partial, mode="w") as tar:
        for name, data in ((config_name, image_config), ("layer/layer.tar", layer), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), _EPOCH, 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.replace(target)
    return target


_BASE_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "root", "var", "run")


def _base() -> list[Entry]:
    entries = [Entry(name, mode=0o1777 if name == "tmp" else 0o755) for name in _BASE_DIRS]
    entries.append(Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
                         mode=0o644))
    entries.append(Entry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n", mode=0o644))
    return entries


def busybox_applets(busybox: Path = BUSYBOX) -> list[str]:
    if not busybox.is_file():
        raise KubegpuError(f"{busybox}: not found; the real-node test image needs Debian's busybox-static "
                           "(apt-get install busybox-static)")
    result = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, timeout=30, check=False)
    applets = [line.strip() for line in result.stdout.splitlines() if line.strip() and "/" not in line]
    if result.returncode != 0 or "sh" not in applets:
        raise KubegpuError(f"{busybox} --list: no `sh` applet (exit {result.returncode}); install busybox-static")
    return applets


def build_test_image(target: Path, busybox: Path = BUSYBOX) -> Path:
    """The test image: busybox as /bin/busybox and every applet as /bin/<applet> -> busybox."""
    entries = _base()
    entries.append(Entry("bin/busybox", data=busybox.read_bytes()))
    entries.extend(Entry(f"bin/{applet}", link="busybox") for applet in busybox_applets(busybox)
                   if applet != "busybox")
    config = {"Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"], "Cmd": ["sh"], "WorkingDir": "/"}
    return docker_archive(target, [TEST_IMAGE, *TEST_IMAGE_ALIASES], entries, config)


def build_pause_image(target: Path, pause_binary: Path) -> Path:
    """The sandbox image: the static pause binary as /pause, its entrypoint."""
    entries = [Entry("dev"), Entry("proc"), Entry("sys"), Entry("pause", data=pause_binary.read_bytes())]
    return docker_archive(target, [PAUSE_IMAGE], entries, {"Entrypoint": ["/pause"]})
