"""The node-side components working together, driven only through the `kubegpu` command line.

One simulated 8x A100-80GB node (a JSON state file shared by every process, as one real node's driver would be)
goes through what a platform engineer does: cut it with mig-parted, check it, label it, serve its MIG devices to a
kubelet, scrape its metrics, then break GPU 0 with an XID and watch the device plugin take its slices out.
Every command is a real subprocess; the kubelet is tests/fakes/fake_kubelet.py over real unix sockets.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.config.migparted import load_mig_parted_config, resolve_layout
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from tests.e2e.cli import ENV, EXAMPLES, REPO, free_port, kubegpu, ok, start, stop
from tests.fakes.fake_kubelet import FakeKubelet

MIG_PARTED = EXAMPLES / "mig-parted.yaml"
MIG_MIXED = EXAMPLES / "device-plugin-mig-mixed.yaml"
GPUS = 8


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated node with the all-balanced layout applied: the directory holding node.json."""
    work = tmp_path_factory.mktemp("node")
    ok("sim-node", "create", "--gpus", f"{GPUS}xA100-SXM4-80GB", "--out", "node.json", cwd=work)
    applied = ok("mig-parted", "apply", "-f", MIG_PARTED, "-c", "all-balanced", "--gpu-backend", "sim:node.json",
                 cwd=work)
    assert "all-balanced" in applied.stdout
    return work


def mig_uuids_by_resource(node_file: Path, gpu: int | None = None) -> dict[str, set[str]]:
    """MIG device UUIDs per `nvidia.com/mig-<profile>` resource, read straight from the node file."""
    backend = SimulatedBackend(node_file)
    try:
        found: dict[str, set[str]] = {}
        for device in backend.devices():
            if gpu is not None and device.index != gpu:
                continue
            for mig in backend.mig_devices(device.index):
                found.setdefault(f"nvidia.com/mig-{mig.profile_name}", set()).add(mig.uuid)
        return found
    finally:
        backend.close()


def expected_profile_counts(node_file: Path) -> Counter[str]:
    """What all-balanced in examples/mig-parted.yaml asks for on this node's GPUs, by profile name."""
    backend = SimulatedBackend(node_file)
    try:
        gpus = backend.devices()
    finally:
        backend.close()
    layout = resolve_layout(load_mig_parted_config(MIG_PARTED), "all-balanced", gpus)
    counts: Counter[str] = Counter()
    for gpu in gpus:
        model = get_model(gpu.product_name)
        counts.update(model.profile(profile_id).name for profile_id in layout[gpu.index] or [])
    return counts


def test_the_node_carries_all_balanced_and_mig_parted_assert_says_so(node: Path) -> None:
    counts = expected_profile_counts(node / "node.json")
    on_node = {r.removeprefix("nvidia.com/mig-"): len(u) for r, u in mig_uuids_by_resource(node / "node.json").items()}
    assert on_node == dict(counts)
    assert sum(counts.values()) > GPUS  # really cut: more than one instance per GPU

    ok("mig-parted", "assert", "-f", MIG_PARTED, "-c", "all-balanced", "--gpu-backend", "sim:node.json", cwd=node)
    other = kubegpu("mig-parted", "assert", "-f", MIG_PARTED, "-c", "all-1g.10gb", "--gpu-backend", "sim:node.json",
                    cwd=node)
    assert other.returncode == 1
    assert "all-1g.10gb" in other.stdout + other.stderr
    assert "Traceback" not in other.stderr


def test_discover_writes_gfd_labels_for_the_mig_layout(node: Path) -> None:
    ok("discover", "--gpu-backend", "sim:node.json", "--config-file", MIG_MIXED, "--oneshot", "--no-timestamp",
       "--output-file", "labels", cwd=node)
    labels = dict(line.split("=", 1) for line in (node / "labels").read_text().splitlines() if line)

    assert labels["nvidia.com/gpu.count"] == str(GPUS)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert "nvidia.com/gfd.timestamp" not in labels
    counted = {m.group(1): int(v) for k, v in labels.items() if (m := re.fullmatch(r"nvidia\.com/mig-(.+)\.count", k))}
    assert counted == dict(expected_profile_counts(node / "node.json"))
    assert counted["1g.10gb"] == 2 * GPUS  # NVIDIA's all-balanced on an A100-80GB: 2x 1g.10gb, 2g.20gb, 3g.40gb
    assert labels["nvidia.com/mig-3g.40gb.memory"] == str(
        get_model("A100-SXM4-80GB").profile("3g.40gb").memory_mib)


@pytest.fixture
def exporter(node: Path) -> Iterator[str]:
    """`kubegpu exporter` on a free loopback port; yields its /metrics URL and always stops it."""
    port = free_port()
    process = start("exporter", "--gpu-backend", "sim:node.json", "--address", f"127.0.0.1:{port}",
                    "--collect-interval", "200", cwd=node, log=node / "exporter.log")
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        status = stop(process)
        assert status == 0, (node / "exporter.log").read_text()  # SIGTERM is a clean stop


def scrape_until(url: str, ready: str, timeout: float = 20.0) -> str:
    """The exporter's page once it contains `ready` (its first collection has run)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                last = response.read().decode()
            if ready in last:
                return last
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url}: no {ready!r} within {timeout}s; last page:\n{last[:500]}")


def test_exporter_serves_one_series_per_mig_instance(node: Path, exporter: str) -> None:
    page = scrape_until(exporter, "GPU_I_PROFILE")
    families = {f.name: f for f in text_string_to_metric_families(page)}

    used = families["DCGM_FI_DEV_FB_USED"].samples
    per_instance = Counter(s.labels["GPU_I_PROFILE"] for s in used if "GPU_I_PROFILE" in s.labels)
    assert per_instance == expected_profile_counts(node / "node.json")
    instances = {(s.labels["gpu"], s.labels["GPU_I_ID"]) for s in used if "GPU_I_ID" in s.labels}
    assert len(instances) == sum(per_instance.values())  # one series per (GPU, GPU instance), none twice
    assert {s.labels["modelName"] for s in used} == {"NVIDIA A100-SXM4-80GB"}
    assert {s.labels["gpu"] for s in used} == {str(i) for i in range(GPUS)}


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory for the kubelet's and the plugin's unix sockets (paths are limited to 107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="kg-e2e-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_device_plugin_serves_the_layout_and_drops_gpu0_after_xid_79(node: Path, plugin_dir: Path) -> None:
    node_file = node / "node.json"
    expected = mig_uuids_by_resource(node_file)
    on_gpu0 = mig_uuids_by_resource(node_file, gpu=0)
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    plugin = start(
        "device-plugin", "--gpu-backend", "sim:node.json", "--config-file", MIG_MIXED,
        "--kubelet-socket", plugin_dir / "kubelet.sock", "--device-plugin-dir", plugin_dir,
        "--cdi-dir", node / "cdi", "--relist-interval", "0.2", "--health-quiet-period", "3600",
        cwd=node, log=node / "device-plugin.log",
    )
    try:
        await kubelet.wait_for(
            lambda: {r: set(p.devices) for r, p in kubelet.plugins.items()} == expected, timeout=20)
        assert all(kubelet.allocatable(r) == len(ids) for r, ids in expected.items())
        assert "nvidia.com/gpu" not in kubelet.plugins  # mixed: every GPU is cut, so no whole GPUs are offered

        injected = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kubegpu", "sim-node", "inject-xid", "node.json", "--gpu", "0", "--xid", "79",
            cwd=node, env=ENV)
        assert await injected.wait() == 0

        def gpu0_out() -> bool:
            return all(
                kubelet.plugins[r].devices[i] == ("Unhealthy" if i in on_gpu0.get(r, set()) else "Healthy")
                for r, ids in expected.items() for i in ids
            )

        await kubelet.wait_for(gpu0_out, timeout=10)
        for resource, ids in expected.items():
            assert kubelet.allocatable(resource) == len(ids) - len(on_gpu0.get(resource, set()))
    finally:
        status = stop(plugin)
        await kubelet.stop()
    assert status == 0, (node / "device-plugin.log").read_text()
    leftovers = sorted(p.name for p in plugin_dir.iterdir() if p.name != "kubelet.sock")
    assert leftovers == []  # SIGTERM removes the plugin's sockets


def quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    assert [lang for lang, _ in blocks] == ["sh"], "Quick start must hold exactly one sh block"
    return [line.strip() for line in blocks[0][1].splitlines() if line.strip() and not line.strip().startswith("#")]


def test_readme_quick_start_is_two_commands_in_one_sh_block() -> None:
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    install, run = (part.strip() for part in commands[0].split("&&"))
    assert install.startswith("python3 -m pip install .")
    assert run == "python3 -m kubegpu simulate"
    script = commands[1].split()
    assert script[0] == "sh" and (REPO / script[1]).is_file()


def test_quick_start_simulate_command_exists() -> None:
    run = quick_start_commands()[0].split("&&")[1].split()
    assert run[:3] == ["python3", "-m", "kubegpu"]
    result = ok(*run[3:], "--help")
    assert "--scenario" in result.stdout
