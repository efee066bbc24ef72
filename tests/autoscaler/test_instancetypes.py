"""Instance types in Karpenter's kwok JSON format: parsing, labels, malformed input, the shipped catalogue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubegpu.autoscaler.catalog import fake_instance_types, shipped_catalogue
from kubegpu.autoscaler.instancetypes import default_instance_types, load_instance_types, to_kwok
from kubegpu.errors import ConfigError

KWOK_ENTRY = {
    "name": "g-8x-amd64-linux", "architecture": "amd64", "operatingSystems": ["linux"],
    "resources": {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "20Gi", "nvidia.com/gpu": "1"},
    "offerings": [
        {"Price": 1.624, "Available": True, "Requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]},
        {"Price": 0.55, "Available": True, "ReservationCapacity": 0, "Requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-b"]}]}],
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "types.json"
    path.write_text(json.dumps(data))
    return path


def test_karpenter_kwok_file_loads(tmp_path: Path) -> None:
    [it] = load_instance_types(write(tmp_path, [KWOK_ENTRY]))
    assert it.capacity["pods"] == 110          # kwok default
    assert it.capacity["nvidia.com/gpu"] == 1
    assert it.allocatable["cpu"] == pytest.approx(7.9)   # kube-reserved 100m
    assert {(o.capacity_type, o.zone, o.price) for o in it.offerings} == {
        ("on-demand", "test-zone-a", 1.624), ("spot", "test-zone-b", 0.55)}
    assert it.labels["kubegpu.io/instance-family"] == "g"
    assert it.labels["kubegpu.io/instance-size"] == "8"
    assert it.cheapest_offering().price == 0.55  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda e: e["offerings"][1].update(Price="cheap"), "[0].offerings[1].Price: must be a number"),
        (lambda e: e["offerings"][0].update(Requirements=[]), "[0].offerings[0].Requirements: needs both"),
        (lambda e: e["offerings"][0]["Requirements"][0].update(values=["reserved-ish"]), "capacity type"),
        (lambda e: e["resources"].update(cpu="eight"), "[0].resources.cpu"),
        (lambda e: e.update(offerings=[]), "[0].offerings: must be a non-empty list"),
        (lambda e: e.update(gpuModel="Z9000"), "[0].gpuModel"),
        (lambda e: e["offerings"][0].update(Available="maybe"), "[0].offerings[0].Available: must be true or false"),
        (lambda e: e["resources"].update({"nvidia.com/gpu": "-1"}), "[0].resources.nvidia.com/gpu: must not be"),
    ],
)
def test_malformed_entries_are_one_line(tmp_path: Path, mutate: object, fragment: str) -> None:
    entry = json.loads(json.dumps(KWOK_ENTRY))
    mutate(entry)  # type: ignore[operator]
    path = write(tmp_path, [entry])
    with pytest.raises(ConfigError) as err:
        load_instance_types(path)
    assert str(err.value).startswith(f"{path}: ")
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_and_invalid_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_instance_types(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(ConfigError, match=r"bad\.json:1:\d+: invalid JSON"):
        load_instance_types(bad)


def test_shipped_catalogue_has_gpu_and_cpu_types_and_round_trips() -> None:
    types = default_instance_types()
    by_name = {t.name: t for t in types}
    assert by_name["p4de.24xlarge"].gpu_model == "A100-SXM4-80GB"
    assert by_name["p5.48xlarge"].gpu_count == 8
    assert by_name["g6.xlarge"].labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert any(t.gpu_count == 0 for t in types)
    assert all(o.price < max(x.price for x in t.offerings) for t in types for o in t.offerings
               if o.capacity_type == "spot")
    assert to_kwok(types) == to_kwok(shipped_catalogue())


def test_fake_instance_types_follow_karpenter_shape() -> None:
    types = fake_instance_types(400)
    assert len(types) == 400
    assert types[9].capacity["cpu"] == 10 and types[9].capacity["pods"] == 100
    assert types[9].offerings[0].price == pytest.approx(0.1 * 10 + 0.1 * 20 * 2**30 / 1e9)
