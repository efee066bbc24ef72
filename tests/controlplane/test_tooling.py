"""The control-plane tooling without the real binaries: pinned versions, certificates, kwok GPU nodes, the one-line
errors (no Go, no module proxy, a component that never becomes ready, a port taken) and `down` stopping exactly the
processes it started."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.testing import certs, controlplane, k8sbuild, processes
from kubegpu.testing.controlplane import ControlPlaneError
from kubegpu.testing.kwoknodes import KWOK_ANNOTATION, gpu_node

ROOT = Path(__file__).resolve().parents[2]


def test_go_mod_pins_one_release_and_every_staging_module_to_it() -> None:
    go_mod = ROOT / "test" / "k8s" / "go.mod"
    versions = k8sbuild.read_versions(go_mod)
    major, minor, patch = (int(x) for x in versions.kubernetes.lstrip("v").split("."))
    assert (major, minor) >= (1, 34) and "-" not in versions.kubernetes
    assert versions.etcd.startswith("v3.") and versions.kwok.startswith("v0.")
    replaces = re.findall(r"^\s*(k8s\.io/[\w-]+) => (k8s\.io/[\w-]+) (v\S+)$", go_mod.read_text(), re.MULTILINE)
    assert len(replaces) >= 25
    assert all(old == new and version == f"v0.{minor}.{patch}" for old, new, version in replaces)
    assert k8sbuild.bin_dir(versions).parts[-2:] == (versions.kubernetes, "bin")


def test_cache_lives_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert k8sbuild.bin_dir().is_relative_to(tmp_path / "kubegpu" / "k8s")
    assert not k8sbuild.is_built()
    assert "kube-apiserver" in k8sbuild.missing_binaries()


def test_build_without_go_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KubegpuError, match=r"^Go is not installed or not on PATH"):
        k8sbuild.build()


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go command")
def test_build_without_the_module_proxy_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "modcache"))  # empty: every module must come from the proxy
    monkeypatch.setenv("GOPROXY", "off")
    with pytest.raises(KubegpuError, match=r"cannot fetch modules from the Go module proxy \(GOPROXY=off\)"):
        k8sbuild.build()


def test_certificates_give_an_admin_client_and_a_loopback_serving_cert(tmp_path: Path) -> None:
    pki = certs.generate(tmp_path)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    serving = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes())
    admin.verify_directly_issued_by(ca)
    serving.verify_directly_issued_by(ca)
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert all(oct(path.stat().st_mode)[-3:] == "600" for path in tmp_path.iterdir())


def test_kwok_gpu_node_has_catalog_capacity_and_discovery_labels() -> None:
    node = gpu_node("n1", "4xH100-SXM5-80GB")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "4" and labels["nvidia.com/gpu.memory"] == "81559"
    assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    with pytest.raises(ConfigError):
        gpu_node("n2", "0xA100-SXM4-80GB")


# ---------------------------------------------------------------- up/down with stand-in binaries


def _fake_bins(directory: Path, etcd_body: str) -> Path:
    """Stand-ins for the binaries: a kube-apiserver whose --help lists DRA gates, and an etcd running
    ``etcd_body`` (Python)."""
    directory.mkdir()
    for name in k8sbuild.BINARIES:
        (directory / name).write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    (directory / "kube-apiserver").write_text(
        f"#!{sys.executable}\nprint('      DRAPartitionableDevices=true|false (BETA - default=true)')\n")
    (directory / "etcd").write_text(f"#!{sys.executable}\n{etcd_body}\n")
    for path in directory.iterdir():
        path.chmod(0o755)
    (directory / k8sbuild.KWOK_STAGES).write_text("")
    return directory


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_component_that_exits_is_named_with_its_log_tail(tmp_path: Path) -> None:
    bins = _fake_bins(tmp_path / "bin", "print('etcdmain: cannot open data dir: disk on fire'); raise SystemExit(2)")
    with pytest.raises(ControlPlaneError) as caught:
        controlplane.up(tmp_path / "cp", nodes=0, bins=bins)
    message = str(caught.value)
    assert message.startswith("etcd exited with status 2") and "disk on fire" in message and "\n" not in message
    assert not (tmp_path / "cp" / "pids").exists()


def test_a_component_that_never_becomes_ready_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bins = _fake_bins(tmp_path / "bin", "import time\nprint('waiting for quorum', flush=True)\ntime.sleep(300)")
    monkeypatch.setattr(controlplane, "READY_TIMEOUT_S", 1.0)
    pids: list[int] = []
    original = controlplane.down

    def down_recording(directory: Path | str) -> list[str]:
        pids.extend(pid for pid, _, _ in processes.read_pids(Path(directory)))
        return original(directory)

    monkeypatch.setattr(controlplane, "down", down_recording)
    with pytest.raises(ControlPlaneError, match=r"^etcd not ready after 1s .*waiting for quorum"):
        controlplane.up(tmp_path / "cp", nodes=0, bins=bins)
    assert len(pids) == 1 and not _alive(pids[0])


def test_a_taken_port_is_reported_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        body = (f"import socket\ns = socket.socket()\ntry:\n    s.bind(('127.0.0.1', {port}))\n"
                f"except OSError:\n    print('listen tcp 127.0.0.1:{port}: bind: address already in use')\n"
                "    raise SystemExit(1)")
        bins = _fake_bins(tmp_path / "bin", body)
        with pytest.raises(ControlPlaneError, match=rf"^etcd: port {port} is taken"):
            controlplane.up(tmp_path / "cp", nodes=0, bins=bins)


def test_missing_binaries_fail_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    with pytest.raises(ControlPlaneError, match=r"missing kube-apiserver, .*run `scripts/control-plane.sh build`"):
        controlplane.up(tmp_path / "cp", bins=tmp_path / "bin")
    assert not (tmp_path / "cp").exists()


def test_down_stops_only_what_it_started(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    ours = subprocess.Popen([sleep, "60"], start_new_session=True)
    stranger = subprocess.Popen([sleep, "60"], start_new_session=True)
    try:
        (tmp_path / "pids").write_text(f"{ours.pid} etcd {sleep}\n{stranger.pid} kwok /somewhere/else/kwok\n")
        assert controlplane.down(tmp_path) == ["etcd"]
        assert ours.wait(5) is not None
        time.sleep(0.1)
        assert stranger.poll() is None  # a pid whose binary does not match is never signalled
        assert not (tmp_path / "pids").exists()
        assert controlplane.down(tmp_path) == []  # twice in a row: nothing left, nothing to do
    finally:
        stranger.kill()
        stranger.wait()


def test_down_waits_out_an_exec_still_under_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Popen returns once the close-on-exec pipe closes, a moment before the kernel maps the new program's command
    # line: /proc then shows an empty one, which must not pass for a stranger's process
    sleep = shutil.which("sleep")
    assert sleep is not None
    ours = subprocess.Popen([sleep, "60"], start_new_session=True)
    real_read_bytes = Path.read_bytes
    mid_exec_reads = [2]

    def read_bytes(path: Path) -> bytes:
        if path == Path(f"/proc/{ours.pid}/cmdline") and mid_exec_reads[0]:
            mid_exec_reads[0] -= 1
            return b""
        return real_read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    try:
        (tmp_path / "pids").write_text(f"{ours.pid} etcd {sleep}\n")
        assert controlplane.down(tmp_path) == ["etcd"]
        assert ours.wait(5) is not None and mid_exec_reads == [0]
    finally:
        ours.kill()
        ours.wait()


def test_script_usage_errors_exit_2_and_bad_input_exits_1(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "control-plane.sh"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    usage = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, env=env, check=False)
    assert usage.returncode == 2 and "DIR" in usage.stderr
    missing = subprocess.run(["bash", str(script), "up", str(tmp_path / "cp")], capture_output=True, text=True,
                             env=env, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1].startswith("error: ") and "missing kube-apiserver" in missing.stderr


def test_missing_binaries_skip_locally_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import _control_plane_unavailable

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="real control plane unavailable: not built"):
        _control_plane_unavailable("not built")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="real control plane unavailable in CI: not built"):
        _control_plane_unavailable("not built")


def test_a_socket_in_the_plugin_directory_is_traced_to_its_process() -> None:
    directory = Path(tempfile.mkdtemp(prefix="kg-dp-", dir="/tmp"))  # a Unix socket path stays short
    listener = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen();"
        " print('up', flush=True); time.sleep(60)"), str(directory / "nvidia-gpu.sock")], stdout=subprocess.PIPE)
    try:
        assert listener.stdout is not None and listener.stdout.readline() == b"up\n"
        owners = processes.unix_socket_owners(directory)
        assert [(path.name, pid) for path, pid, _ in owners] == [("nvidia-gpu.sock", listener.pid)]
        assert processes.parent_pid(listener.pid) == os.getpid()
        assert processes.stop_orphans_serving(directory) == owners  # not an orphan: named, left running
        assert listener.poll() is None
    finally:
        listener.kill()
        listener.wait()
        shutil.rmtree(directory, ignore_errors=True)
    assert processes.unix_socket_owners(directory) == []
