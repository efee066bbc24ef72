"""Fractional GPUs through DRA consumable capacity: the driver publishes shared GPUs with 1000 thousandths of
`compute`, the allocator packs shares the way kube-scheduler does (policy rounding, defaults, consumedCapacity,
shareID), and prepare turns a share into MPS limits in proportion."""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.driver import DraDriver
from kubegpu.dra.server import DraPluginServer
from kubegpu.dra.slices import build_slices
from kubegpu.errors import ConfigError
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.scheduling.dra import RequestPolicy, allocate_in_order, parse_all
from kubegpu.scheduling.dra.capacity import consumption
from tests.dra.builders import claim, device, slice_
from tests.dra.fake_kubelet import FakeDraKubelet

FRACTION = "fraction.gpu.kubegpu.io"


def share(name: str, thousandths: int | None, cls: str = FRACTION, namespace: str = "default") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if thousandths is not None:
        exactly["capacity"] = {"requests": {"compute": str(thousandths)}}
    return claim(name, {"name": "gpu", "exactly": exactly}, namespace=namespace)


def published(tmp: Path, gpus: str = "2xA100-SXM4-40GB") -> list[dict[str, Any]]:
    backend = SimulatedBackend.create(tmp / "node.json", gpus=gpus, node_name="node-a")
    return build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=False, fractional=True))


def allocate(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> dict[str, Any]:
    classes = {c.name: c for c in parse_all(shipped_class_objects(), "DeviceClass", "shipped")}
    outcomes = allocate_in_order(parse_all(slices, "ResourceSlice", "slices"), classes,
                                 parse_all(claims, "ResourceClaim", "claims"))
    return {key: outcome.to_json() for key, outcome in outcomes.items()}


def test_consumption_follows_the_request_policy() -> None:
    policy = RequestPolicy(default=1000, minimum=1, maximum=1000, step=1)
    assert consumption(None, 1000, policy) == 1000  # not named: the default (the whole GPU)
    assert consumption(299.5, 1000, policy) == 300  # rounded up onto the step grid
    assert consumption(1001, 1000, policy) is None  # above max
    coarse = RequestPolicy(minimum=100, step=250)
    assert consumption(20, 1000, coarse) == 100 and consumption(101, 1000, coarse) == 350
    assert consumption(None, 80, None) == 80  # no policy, not named: the whole capacity
    values = RequestPolicy(default=0, valid_values=(0.0,))
    assert consumption(None, 40, values) == 0 and consumption(10, 40, values) is None


def test_shared_gpu_is_published_with_consumable_compute(tmp_path: Path) -> None:
    [item] = published(tmp_path)
    gpu = item["spec"]["devices"][0]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["compute"] == {"value": "1000", "requestPolicy": {
        "default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}}}
    assert gpu["capacity"]["memory"]["requestPolicy"] == {"default": "0", "validValues": ["0"]}
    plain = build_slices("node-a", gpu_offers(read_node(SimulatedBackend(tmp_path / "node.json")), False))
    assert "allowMultipleAllocations" not in plain[0]["spec"]["devices"][0]


def test_shares_pack_a_gpu_until_its_thousandths_run_out(tmp_path: Path) -> None:
    answer = allocate(published(tmp_path), [share("a", 300), share("b", 700), share("c", 100), share("d", 950)])
    placed = {k: (v["results"][0]["device"], v["results"][0]["consumedCapacity"]) for k, v in answer.items()
              if "results" in v}
    assert placed == {"default/a": ("gpu-0", {"compute": "300", "memory": "0"}),
                      "default/b": ("gpu-0", {"compute": "700", "memory": "0"}),
                      "default/c": ("gpu-1", {"compute": "100", "memory": "0"})}
    assert "unschedulable" in answer["default/d"]  # 900 left on gpu-1, none on gpu-0
    ids = [answer[k]["results"][0]["shareID"] for k in ("default/a", "default/b", "default/c")]
    assert len(set(ids)) == 3 and all(str(uuid.UUID(i)) == i for i in ids)  # RFC 4122 form, as the API wants


def test_a_claim_naming_no_capacity_takes_the_whole_shared_gpu(tmp_path: Path) -> None:
    slices = published(tmp_path, "1xA100-SXM4-40GB")
    answer = allocate(slices, [share("whole", None, cls="gpu.nvidia.com"), share("small", 1)])
    assert answer["default/whole"]["results"][0]["consumedCapacity"]["compute"] == "1000"
    assert "unschedulable" in answer["default/small"]


def test_held_shares_count_and_exclusive_devices_refuse_shares(tmp_path: Path) -> None:
    slices = published(tmp_path, "1xA100-SXM4-40GB")
    held = share("held", None)
    held["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"compute": "950"}}]}}}
    answer = allocate(slices, [held, share("fits", 50), share("over", 1)])
    assert answer["default/fits"]["results"][0]["device"] == "gpu-0"
    assert "unschedulable" in answer["default/over"]
    # a device allocated whole (no allowMultipleAllocations) is never shared; a capacity request is a minimum there
    exclusive = [slice_("s", "node-a", [device("gpu-0", memory="40Gi")])]
    big = claim("big", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                 "capacity": {"requests": {"memory": "80Gi"}}}})
    small = claim("small", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                     "capacity": {"requests": {"memory": "10Gi"}}}})
    answer = allocate(exclusive, [big, small, share("again", None, cls="gpu.nvidia.com")])
    assert "unschedulable" in answer["default/big"]
    assert answer["default/small"]["results"] == [{"request": "g", "driver": "gpu.nvidia.com", "pool": "node-a",
                                                   "device": "gpu-0"}]
    assert "unschedulable" in answer["default/again"]


def test_bad_request_policy_is_one_line_naming_the_field(tmp_path: Path) -> None:
    [item] = published(tmp_path, "1xA100-SXM4-40GB")
    item["spec"]["devices"][0]["capacity"]["compute"]["requestPolicy"]["validRange"]["step"] = "0"
    with pytest.raises(ConfigError, match=r"spec\.devices\[0\]\.capacity\.compute\.requestPolicy\.validRange\.step"):
        parse_all([item], "ResourceSlice", "slices")


def test_prepare_enforces_a_share_through_mps_limits() -> None:
    """Two shares of one GPU, 300 and 700 thousandths: each claim's MPS limits (what its daemon is told, and the
    environment its containers get) are 30 % / 70 % of the threads and the same share of the GPU's memory; the
    kubelet gets each share's ID back."""
    with tempfile.TemporaryDirectory(prefix="dra") as tmp:
        root = Path(tmp)
        slices = published(root, "1xA100-SXM4-40GB")
        objects = [share("small", 300, namespace="ml"), share("large", 700, namespace="ml")]
        answer = allocate(slices, objects)
        claims = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            obj["metadata"]["uid"] = f"uid-{name}"
            obj["status"] = {"allocation": {"devices": {"results": answer[f"ml/{name}"]["results"], "config": []}}}
            claims[("ml", name)] = obj
        plugin = root / "plugins" / "gpu.nvidia.com"
        driver = DraDriver(SimulatedBackend(root / "node.json"), "node-a", plugin, root / "cdi",
                           lambda ns, name: claims.get((ns, name)), fractional=True)
        memory = driver.offers[0].gpu.memory_mib

        async def run() -> None:
            server = DraPluginServer(driver, plugin, root / "registry")
            await server.start()
            kubelet = FakeDraKubelet(root / "registry")
            try:
                assert await kubelet.register()
                for name, percent in (("small", 30), ("large", 70)):
                    ref = ("ml", f"uid-{name}", name)
                    response = await kubelet.prepare(ref)
                    entry = response.claims[ref[1]]
                    assert entry.error == ""
                    assert entry.devices[0].share_id == answer[f"ml/{name}"]["results"][0]["shareID"]
                    spec = json.loads((root / "cdi" / f"k8s.gpu.nvidia.com-claim_uid-{name}.json").read_text())
                    env = spec["containerEdits"]["env"]
                    assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}" in env
                    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory * percent // 100}M" in env
                    limits = json.loads((plugin / "mps" / f"uid-{name}.json").read_text())
                    assert limits["daemons"][0]["commands"] == [
                        f"set_default_active_thread_percentage {percent}",
                        f"set_default_device_pinned_mem_limit 0 {memory * percent // 100}M"]
                    await kubelet.unprepare(ref)
                    assert not (plugin / "mps" / f"uid-{name}.json").exists()
            finally:
                await kubelet.close()
                await server.stop()

        asyncio.run(run())


def test_the_example_template_asks_for_300_thousandths(tmp_path: Path) -> None:
    """examples/fractional-gpu.yaml, as a claim generated from its template, gets 300 thousandths of a shared GPU."""
    import yaml

    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[2] / "examples" / "fractional-gpu.yaml")
                                   .read_text()))
    [template] = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]
    generated = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "small-inference-gpu", "namespace": "default"}, "spec": template["spec"]["spec"]}
    answer = allocate(published(tmp_path), [generated])
    [result] = answer["default/small-inference-gpu"]["results"]
    assert result["consumedCapacity"] == {"compute": "300", "memory": "0"}
