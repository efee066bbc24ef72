"""The DRA kubelet plugin against a fake kubelet over real unix sockets: registration and version choice,
prepare/unprepare (twice), a restart and a crash in the middle, unknown claims, bad config, concurrent claims."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.driver import ClaimRef, DraDriver
from kubegpu.dra.server import DraPluginServer
from kubegpu.gpu.simulated import SimulatedBackend
from tests.dra.fake_kubelet import FakeDraKubelet

pytestmark = pytest.mark.integration


def allocated(name: str, devices: list[tuple[str, str]], uid: str | None = None,
              config: list[dict[str, Any]] | None = None, pool: str = "node-a") -> dict[str, Any]:
    results = [{"request": r, "driver": "gpu.nvidia.com", "pool": pool, "device": d} for r, d in devices]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": results, "config": config or []}}}}


@dataclass
class Env:
    root: Path
    backend: SimulatedBackend
    claims: dict[tuple[str, str], dict[str, Any]]

    def driver(self, dynamic: bool = True) -> DraDriver:
        return DraDriver(SimulatedBackend(self.root / "node.json"), "node-a", self.root / "plugins" / "gpu.nvidia.com",
                         self.root / "cdi", lambda ns, name: self.claims.get((ns, name)), dynamic_mig=dynamic)

    def add(self, claim: dict[str, Any]) -> tuple[str, str, str]:
        self.claims[("ml", claim["metadata"]["name"])] = claim
        return ("ml", claim["metadata"]["uid"], claim["metadata"]["name"])

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in (self.root / "cdi").glob("*.json")) if (self.root / "cdi").exists() else []


@pytest.fixture
def env() -> Any:
    # short paths: AF_UNIX socket paths are limited to ~107 bytes and pytest's tmp_path can exceed that
    with tempfile.TemporaryDirectory(prefix="dra") as tmp:
        root = Path(tmp)
        backend = SimulatedBackend.create(root / "node.json", gpus="1xA100-SXM4-40GB,1xL4", node_name="node-a")
        yield Env(root, backend, {})


@pytest.fixture
async def served(env: Env) -> AsyncIterator[tuple[DraPluginServer, FakeDraKubelet]]:
    server = DraPluginServer(env.driver(), env.root / "plugins" / "gpu.nvidia.com", env.root / "registry")
    await server.start()
    kubelet = FakeDraKubelet(env.root / "registry")
    try:
        yield server, kubelet
    finally:
        await kubelet.close()
        await server.stop()


async def test_registration_offers_v1_then_v1beta1(served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    server, kubelet = served
    assert await kubelet.register()
    assert kubelet.info.type == "DRAPlugin" and kubelet.info.name == "gpu.nvidia.com"
    assert list(kubelet.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert kubelet.info.endpoint == str(server.dra_socket.absolute())
    assert kubelet.version == "v1.DRAPlugin"
    await asyncio.wait_for(server.status_changed.wait(), 5)
    assert server.registered


async def test_sockets_are_owner_only(served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    server, _ = served
    for socket_path in (server.dra_socket, server.registration_socket):
        assert socket_path.stat().st_mode & 0o777 == 0o600, socket_path


async def test_old_kubelet_picks_v1beta1_and_a_kubelet_without_either_refuses(env: Env,
                                                                           served: tuple[DraPluginServer,
                                                                                         FakeDraKubelet]) -> None:
    server, _ = served
    old = FakeDraKubelet(env.root / "registry", supported=("v1beta1.DRAPlugin",))
    assert await old.register()
    assert old.version == "v1beta1.DRAPlugin"
    uid = env.add(allocated("c", [("gpu", "gpu-1")]))
    response = await old.prepare(uid)
    assert response.claims[uid[1]].devices[0].device_name == "gpu-1"
    await old.close()
    none = FakeDraKubelet(env.root / "registry", supported=("v2.DRAPlugin",))
    assert not await none.register()
    await asyncio.wait_for(server.status_changed.wait(), 5)
    assert not server.registered and "none of services" in server.registration_error


async def test_prepare_and_unprepare_twice_with_dynamic_mig(env: Env,
                                                           served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    _, kubelet = served
    assert await kubelet.register()
    claim = env.add(allocated("mig", [("small", "gpu-0-mig-1g5gb-19-6"), ("big", "gpu-0-mig-3g20gb-9-0")]))
    first = await kubelet.prepare(claim)
    second = await kubelet.prepare(claim)
    assert first == second  # idempotent: answered from the checkpoint, nothing created twice
    entry = first.claims[claim[1]]
    assert entry.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name) for d in entry.devices] == [
        (["small"], "node-a", "gpu-0-mig-1g5gb-19-6"), (["big"], "node-a", "gpu-0-mig-3g20gb-9-0")]
    assert list(entry.devices[0].cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=uid-mig-gpu-0-mig-1g5gb-19-6"]
    placements = sorted((m.profile_id, m.start) for m in env.backend.mig_devices(0))
    assert placements == [(9, 0), (19, 6)]  # exactly the allocated placements
    spec = json.loads((env.root / "cdi" / "k8s.gpu.nvidia.com-claim_uid-mig.json").read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == ["uid-mig-gpu-0-mig-1g5gb-19-6", "uid-mig-gpu-0-mig-3g20gb-9-0"]
    uuids = {m.start: m.uuid for m in env.backend.mig_devices(0)}
    assert f"NVIDIA_VISIBLE_DEVICES={uuids[6]},{uuids[0]}" in spec["containerEdits"]["env"]
    assert any("nvidia-cap" in n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"])
    for _ in range(2):
        response = await kubelet.unprepare(claim)
        assert response.claims[claim[1]].error == ""
    assert env.backend.mig_devices(0) == [] and env.cdi_files() == []


async def test_unknown_and_bad_claims_fail_alone(env: Env, served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    _, kubelet = served
    assert await kubelet.register()
    good = env.add(allocated("good", [("gpu", "gpu-1")]))
    bad_config = [{"source": "FromClaim", "requests": [], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 500}}}}}]
    bad = env.add(allocated("bad", [("gpu", "gpu-0-mig-1g5gb-19-0")], config=bad_config))
    wrong_device = env.add(allocated("nodevice", [("gpu", "gpu-7")]))
    unknown = ("ml", "uid-ghost", "ghost")
    response = await kubelet.prepare(good, bad, wrong_device, unknown)
    assert response.claims[good[1]].error == "" and len(response.claims[good[1]].devices) == 1
    assert "defaultActiveThreadPercentage" in response.claims[bad[1]].error
    assert "gpu-7 is not offered" in response.claims[wrong_device[1]].error
    assert "not found" in response.claims[unknown[1]].error
    assert env.backend.mig_devices(0) == []  # the failed claims left nothing behind
    assert env.cdi_files() == ["k8s.gpu.nvidia.com-claim_uid-good.json"]
    response = await kubelet.unprepare(unknown)
    assert response.claims[unknown[1]].error == ""  # never prepared: already unprepared


async def test_mps_config_reaches_the_cdi_spec(env: Env, served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    _, kubelet = served
    assert await kubelet.register()
    mps = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
            "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25,
                                             "defaultPinnedDeviceMemoryLimit": "10Gi"}}}}}]
    claim = env.add(allocated("shared", [("gpu", "gpu-1")], config=mps))
    response = await kubelet.prepare(claim)
    assert response.claims[claim[1]].error == ""
    spec = json.loads((env.root / "cdi" / "k8s.gpu.nvidia.com-claim_uid-shared.json").read_text())
    environment = spec["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in environment
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in environment
    assert "CUDA_MPS_PIPE_DIRECTORY=/mps/pipe" in environment
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} == {"/mps/pipe", "/mps/log", "/dev/shm"}
    limits = json.loads((env.root / "plugins" / "gpu.nvidia.com" / "mps" / "uid-shared.json").read_text())
    daemon = limits["daemons"][0]
    assert daemon["resource"] == "claim-uid-shared"
    assert daemon["commands"] == ["set_default_active_thread_percentage 25",
                                  "set_default_device_pinned_mem_limit 1 10240M"]
    await kubelet.unprepare(claim)
    assert not (env.root / "plugins" / "gpu.nvidia.com" / "mps" / "uid-shared.json").exists()


async def test_concurrent_claims(env: Env, served: tuple[DraPluginServer, FakeDraKubelet]) -> None:
    _, kubelet = served
    assert await kubelet.register()
    claims = [env.add(allocated(f"c{i}", [("m", f"gpu-0-mig-1g5gb-19-{i}")])) for i in range(7)]
    responses = await asyncio.gather(*(kubelet.prepare(c) for c in claims))
    assert all(r.claims[c[1]].error == "" for r, c in zip(responses, claims, strict=True))
    assert sorted(m.start for m in env.backend.mig_devices(0)) == list(range(7))
    responses = await asyncio.gather(*(kubelet.unprepare(c) for c in claims))
    assert all(r.claims[c[1]].error == "" for r, c in zip(responses, claims, strict=True))
    assert env.backend.mig_devices(0) == []


async def test_restart_keeps_prepared_claims(env: Env) -> None:
    claim = env.add(allocated("keep", [("m", "gpu-0-mig-2g10gb-14-4")]))
    ref = ClaimRef(*claim)
    first = env.driver().prepare([ref])[ref.uid]
    assert first.error == ""
    restarted = env.driver()  # a new process: state only from the checkpoint and the GPUs
    assert restarted.prepare([ref])[ref.uid] == first
    assert len(env.backend.mig_devices(0)) == 1  # not created again
    assert restarted.unprepare([ref]) == {ref.uid: ""}
    assert env.backend.mig_devices(0) == [] and env.cdi_files() == []


async def test_crash_in_the_middle_leaks_nothing(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    claim = env.add(allocated("crash", [("a", "gpu-0-mig-1g5gb-19-0"), ("b", "gpu-0-mig-1g5gb-19-1")]))
    ref = ClaimRef(*claim)
    driver = env.driver()

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit("killed")  # the process dies after creating MIG devices, before the CDI spec

    monkeypatch.setattr("kubegpu.dra.driver.claim_spec", crash)
    with pytest.raises(SystemExit):
        driver._prepare_one(ref)
    assert len(env.backend.mig_devices(0)) == 2  # left behind by the "dead" process
    monkeypatch.undo()
    restarted = env.driver()
    assert env.backend.mig_devices(0) == []  # rolled back at start from the checkpoint
    assert restarted.checkpoint.claims == {}
    result = restarted.prepare([ref])[ref.uid]  # the kubelet's retry works from a clean state
    assert result.error == "" and len(env.backend.mig_devices(0)) == 2


def test_checkpoint_is_checksummed(env: Env) -> None:
    claim = env.add(allocated("c", [("gpu", "gpu-1")]))
    env.driver().prepare([ClaimRef(*claim)])
    path = env.root / "plugins" / "gpu.nvidia.com" / "checkpoint.json"
    text = path.read_text()
    path.write_text(text.replace("uid-c", "uid-x"))
    from kubegpu.errors import KubegpuError

    with pytest.raises(KubegpuError, match="corrupt"):
        env.driver()
    assert os.path.exists(path)


async def test_agent_publishes_taints_and_recovers(env: Env) -> None:
    from kubegpu.clock import VirtualClock
    from kubegpu.dra.agent import DraAgent
    from kubegpu.dra.publish import SlicePublisher
    from kubegpu.kube.memory import MemoryCluster

    cluster = MemoryCluster()
    clock = VirtualClock(0.0)
    driver = env.driver()
    server = DraPluginServer(driver, env.root / "plugins" / "gpu.nvidia.com", env.root / "registry")
    agent = DraAgent(driver, server, SlicePublisher(cluster, "node-a", "gpu.nvidia.com"), clock=clock,
                     quiet_period_s=60)
    agent._since = 0.0
    assert agent.step() == 1
    assert agent.step() is None
    event = env.backend.inject_xid(1, 79)
    clock.advance_to(event.timestamp + 1)
    assert agent.step() == 2
    devices = [d for s in cluster.list("ResourceSlice") for d in s["spec"].get("devices", [])]
    assert next(d for d in devices if d["name"] == "gpu-1")["taints"][0]["effect"] == "NoExecute"
    clock.advance_to(event.timestamp + 61)
    assert agent.step() == 3
    devices = [d for s in cluster.list("ResourceSlice") for d in s["spec"].get("devices", [])]
    assert all("taints" not in d for d in devices)


async def test_registration_socket_comes_back_after_kubelet_restart(env: Env) -> None:
    server = DraPluginServer(env.driver(), env.root / "plugins" / "gpu.nvidia.com", env.root / "registry")
    await server.start()
    watcher = asyncio.create_task(server.watch(interval=0.05))
    try:
        kubelet = FakeDraKubelet(env.root / "registry")
        assert await kubelet.register()
        await kubelet.close()
        server.registration_socket.unlink()  # the kubelet wipes its registry directory on restart
        again = FakeDraKubelet(env.root / "registry")
        assert await again.register()
        claim = env.add(allocated("after", [("gpu", "gpu-1")]))
        assert (await again.prepare(claim)).claims[claim[1]].error == ""
        await again.close()
    finally:
        watcher.cancel()
        await server.stop()


def test_restart_sweeps_cdi_specs_of_claims_never_completed(env: Env) -> None:
    kept = env.add(allocated("kept", [("gpu", "gpu-1")]))
    env.driver().prepare([ClaimRef(*kept)])
    (env.root / "cdi" / "k8s.gpu.nvidia.com-claim_uid-ghost.json").write_text("{}")  # crash after the spec write
    env.driver()
    assert env.cdi_files() == ["k8s.gpu.nvidia.com-claim_uid-kept.json"]


def test_whole_gpu_after_dynamic_mig_turns_mig_off(env: Env) -> None:
    driver = env.driver()
    sliced = env.add(allocated("sliced", [("m", "gpu-0-mig-1g5gb-19-0")]))
    assert driver.prepare([ClaimRef(*sliced)])[sliced[1]].error == ""
    whole = env.add(allocated("whole", [("gpu", "gpu-0")]))
    # the scheduler would never do this (counters), but a stale allocation must fail, not hand out a cut GPU
    assert "still has MIG devices" in driver.prepare([ClaimRef(*whole)])[whole[1]].error
    assert driver.unprepare([ClaimRef(*sliced)]) == {sliced[1]: ""}
    assert driver.prepare([ClaimRef(*whole)])[whole[1]].error == ""
    assert not next(g for g in env.backend.devices() if g.index == 0).mig_enabled


def test_an_instance_prepared_for_one_claim_is_not_given_to_another(env: Env) -> None:
    driver = env.driver()
    first = env.add(allocated("first", [("m", "gpu-0-mig-2g10gb-14-0")]))
    stale = env.add(allocated("stale", [("m", "gpu-0-mig-2g10gb-14-0")]))
    assert driver.prepare([ClaimRef(*first)])[first[1]].error == ""
    assert "already prepared for another claim" in driver.prepare([ClaimRef(*stale)])[stale[1]].error
    assert len(env.backend.mig_devices(0)) == 1  # the failed claim's rollback left the other claim's instance alone


async def test_a_slow_prepare_blocks_neither_registration_nor_other_calls(env: Env) -> None:
    """Prepare runs in the DRA server's worker threads: a claim whose preparation hangs (a slow API server, a GPU
    mode switch) holds the driver, not the process — the kubelet can still re-register and send more calls, which
    are answered as soon as the driver is free."""
    release = threading.Event()
    slow = env.add(allocated("slow", [("gpu", "gpu-1")]))
    fast = env.add(allocated("fast", [("m", "gpu-0-mig-1g5gb-19-0")]))
    driver = DraDriver(SimulatedBackend(env.root / "node.json"), "node-a", env.root / "plugins" / "gpu.nvidia.com",
                       env.root / "cdi", lambda ns, name: (release.wait(10), env.claims.get((ns, name)))[1],
                       dynamic_mig=True)
    server = DraPluginServer(driver, env.root / "plugins" / "gpu.nvidia.com", env.root / "registry")
    await server.start()
    kubelet = FakeDraKubelet(env.root / "registry")
    try:
        assert await kubelet.register()
        first = asyncio.create_task(kubelet.prepare(slow))
        second = asyncio.create_task(kubelet.prepare(fast))
        await asyncio.sleep(0.2)
        assert not first.done() and not second.done()  # the slow claim holds the driver
        again = FakeDraKubelet(env.root / "registry")
        assert await asyncio.wait_for(again.register(), 2)  # the registration service still answers
        await again.close()
        release.set()
        responses = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert [r.claims[c[1]].error for r, c in zip(responses, (slow, fast), strict=True)] == ["", ""]
        assert [m.start for m in env.backend.mig_devices(0)] == [0]
    finally:
        release.set()
        await kubelet.close()
        await server.stop()
