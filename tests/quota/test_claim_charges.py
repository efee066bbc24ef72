"""What a pod's ResourceClaims are charged in kubegpu.io/gpu-memory (`kubegpu.quota.claims`): the most the claim's
requests could get, by DeviceClass and CEL selectors over the devices kubegpu's DRA driver publishes for every GPU the
table's shapes allow, narrowed by the pod's node pins for a template claim, never by them for a shared named claim."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.errors import ConfigError
from kubegpu.quota.claims import ClaimSourceMissing, holder_name, parse_classes, pod_claim_charges
from kubegpu.sharing.charges import ChargeTable, shipped_table, table_data, table_from_data

GIB = 1 << 30
CLASSES = parse_classes(shipped_class_objects())
LARGEST = shipped_table().largest_bytes  # a B200: 180Gi
H200 = 141 * GIB


def _exactly(cls: str, *selectors: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": cls, **extra}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return spec


def _template(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {"devices": {"requests": [
        {"name": f"r{i}", **({"firstAvailable": r["firstAvailable"]} if "firstAvailable" in r else {"exactly": r})}
        for i, r in enumerate(requests)]}}}}


def _pod(pins: dict[str, str] | None = None, claims: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceClaims": claims or [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                            "containers": [{"name": "c"}]}
    if pins:
        spec["nodeSelector"] = pins
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def _charge(*requests: dict[str, Any], pins: dict[str, str] | None = None) -> int:
    [charge] = pod_claim_charges(_pod(pins), {"t": _template(*requests)}, {}, CLASSES)
    return charge.bytes


PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"
PRODUCT = "device.attributes['gpu.nvidia.com'].productName == '{}'"


def test_mig_devices_pay_their_profile_and_count() -> None:
    assert _charge(_exactly("mig.nvidia.com", PROFILE.format("3g.40gb"))) == 40 * GIB
    assert _charge(_exactly("mig.nvidia.com", PROFILE.format("1g.10gb"), count=3)) == 30 * GIB
    assert _charge(_exactly("mig.nvidia.com")) == LARGEST  # any profile: the largest, the B200's full slice


def test_whole_gpus_pay_the_largest_gpu_the_pins_and_selectors_allow() -> None:
    assert _charge(_exactly("gpu.nvidia.com")) == LARGEST
    assert _charge(_exactly("gpu.nvidia.com"), pins={"node.kubernetes.io/instance-type": "p5e.48xlarge"}) == H200
    assert _charge(_exactly("gpu.nvidia.com"), pins={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}) == 80 * GIB
    assert _charge(_exactly("gpu.nvidia.com", PRODUCT.format("NVIDIA L4"))) == 22 * GIB
    assert _charge(_exactly("gpu.nvidia.com", count=2), pins={"karpenter.k8s.aws/instance-gpu-name": "h200"}) \
        == 2 * H200
    # a selector that cannot be evaluated on a synthetic device (an attribute only real nodes have) may match
    assert _charge(_exactly("gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].rack == 'r1'")) == LARGEST


def test_fractions_pay_their_thousandths_of_the_gpu_and_all_pays_the_node() -> None:
    pinned = {"node.kubernetes.io/instance-type": "p5e.48xlarge"}
    share = _exactly("fraction.gpu.kubegpu.io", capacity={"requests": {"compute": "300"}})
    assert _charge(share, pins=pinned) == H200 * 300 // 1000
    assert _charge(_exactly("fraction.gpu.kubegpu.io"), pins=pinned) == H200  # no share named: the whole GPU
    # allocationMode All: every GPU of the largest node of the model (a p4d holds 8 A100-40GB)
    every = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}
    assert _charge(every, pins={"node.kubernetes.io/instance-type": "p4d.24xlarge"}) == 8 * 40 * GIB


def test_first_available_pays_the_largest_alternative_and_requests_add_up() -> None:
    alternatives = {"firstAvailable": [{"name": "small", **_exactly("mig.nvidia.com", PROFILE.format("1g.10gb"))},
                                       {"name": "big", **_exactly("gpu.nvidia.com")}]}
    pins = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert _charge(alternatives, pins=pins) == 80 * GIB
    assert _charge(_exactly("mig.nvidia.com", PROFILE.format("1g.10gb")), _exactly("gpu.nvidia.com"),
                   pins=pins) == 90 * GIB


def test_devices_that_are_no_gpu_pay_nothing() -> None:
    nic = {"metadata": {"name": "nic.example.com"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}}
    classes = {**CLASSES, **parse_classes([nic])}
    [charge] = pod_claim_charges(_pod(), {"t": _template(_exactly("nic.example.com"))}, {}, classes)
    assert charge.bytes == 0


def test_a_named_claim_is_charged_once_whatever_its_pods_pin() -> None:
    """A shared claim may be used by pods pinned differently: it pays the largest GPU its own selectors allow, and
    its holder's name follows the claim, not the pod."""
    claim = {"metadata": {"name": "shared", "namespace": "ns", "uid": "c-1"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": _exactly("gpu.nvidia.com")}]}}}
    entry = [{"name": "gpu", "resourceClaimName": "shared"}]
    pinned = _pod({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, entry)
    [charge] = pod_claim_charges(pinned, {}, {"shared": claim}, CLASSES)
    assert charge.shared and charge.bytes == LARGEST and charge.owner_uid == "c-1"
    other = {**_pod(None, entry), "metadata": {"name": "q", "namespace": "ns", "uid": "u-2"}}
    [again] = pod_claim_charges(other, {}, {"shared": claim}, CLASSES)
    assert holder_name(pinned, charge) == holder_name(other, again)
    # a template claim's holder is the pod's own, fixed by its uid and claim entry
    [mine] = pod_claim_charges(_pod(), {"t": _template(_exactly("gpu.nvidia.com"))}, {}, CLASSES)
    assert holder_name(_pod(), mine) == holder_name(_pod(), mine) != holder_name(other, again)


def test_missing_or_bad_claims_are_one_line_naming_them() -> None:
    with pytest.raises(ClaimSourceMissing, match="ns/p: claim gpu: ResourceClaimTemplate ns/t not found"):
        pod_claim_charges(_pod(), {}, {}, CLASSES)
    bad = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}}]}}}}
    with pytest.raises(ConfigError, match="allocationMode"):
        pod_claim_charges(_pod(), {"t": bad}, {}, CLASSES)


def test_the_table_reads_back_from_its_configmap_data() -> None:
    """The controller charges claims by the table the admission policy reads, so it reads it back exactly."""
    for table in (shipped_table(), ChargeTable.for_models(["A100-SXM4-80GB", "L4"], {"nvidia.com/gpu.shared": 2})):
        again = table_from_data(table_data(table))
        assert again.shapes == table.shapes and dict(again.replicas) == dict(table.replicas)
    data = dict(table_data(shipped_table()))
    del data["shape.3.bytes"]
    with pytest.raises(ConfigError, match=r"ConfigMap kubegpu/t: data: missing key shape\.3\.bytes"):
        table_from_data(data, "ConfigMap kubegpu/t")
