"""Karpenter's AWS label and tag names, and the pure derivation of an instance type's labels and resources
from its DescribeInstanceTypes entry (pkg/providers/instancetype/types.go at 1d92708).

Kept free of boto3: the input is the plain dict the API returns, so the derivation is tested without a network.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from kubegpu.sharing.names import GPU_RESOURCE

AWS_DOMAIN = "karpenter.k8s.aws"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"   # Karpenter's name; written next to kubegpu.io/capacity-type
NODEPOOL_TAG = "karpenter.sh/nodepool"
NODECLAIM_TAG = "karpenter.sh/nodeclaim"
NODECLASS_TAG = "karpenter.k8s.aws/ec2nodeclass"
CLUSTER_NAME_TAG = "eks:eks-cluster-name"
MANAGED_BY_TAG = "kubegpu.io/managed-by"


def cluster_tag(cluster: str) -> str:
    return f"kubernetes.io/cluster/{cluster}"


INSTANCE_CATEGORY = f"{AWS_DOMAIN}/instance-category"
INSTANCE_FAMILY = f"{AWS_DOMAIN}/instance-family"
INSTANCE_GENERATION = f"{AWS_DOMAIN}/instance-generation"
INSTANCE_SIZE = f"{AWS_DOMAIN}/instance-size"
INSTANCE_CPU = f"{AWS_DOMAIN}/instance-cpu"
INSTANCE_CPU_MANUFACTURER = f"{AWS_DOMAIN}/instance-cpu-manufacturer"
INSTANCE_MEMORY = f"{AWS_DOMAIN}/instance-memory"
INSTANCE_HYPERVISOR = f"{AWS_DOMAIN}/instance-hypervisor"
INSTANCE_GPU_NAME = f"{AWS_DOMAIN}/instance-gpu-name"
INSTANCE_GPU_MANUFACTURER = f"{AWS_DOMAIN}/instance-gpu-manufacturer"
INSTANCE_GPU_COUNT = f"{AWS_DOMAIN}/instance-gpu-count"
INSTANCE_GPU_MEMORY = f"{AWS_DOMAIN}/instance-gpu-memory"
INSTANCE_LOCAL_NVME = f"{AWS_DOMAIN}/instance-local-nvme"
INSTANCE_EBS_BANDWIDTH = f"{AWS_DOMAIN}/instance-ebs-bandwidth"
CAPACITY_RESERVATION_ID = f"{AWS_DOMAIN}/capacity-reservation-id"
CAPACITY_RESERVATION_TYPE = f"{AWS_DOMAIN}/capacity-reservation-type"
EC2NODECLASS_LABEL = f"{AWS_DOMAIN}/ec2nodeclass"
ZONE_ID_LABEL = "topology.k8s.aws/zone-id"

# Keys that describe the instance type: a positive requirement on one of them fails for a type without it (the
# GPU keys are "DoesNotExist" on a type without exactly one GPU kind, so `gpu-count Gt 0` excludes CPU types).
INSTANCE_TYPE_KEYS = frozenset({
    INSTANCE_CATEGORY, INSTANCE_FAMILY, INSTANCE_GENERATION, INSTANCE_SIZE, INSTANCE_CPU, INSTANCE_CPU_MANUFACTURER,
    INSTANCE_MEMORY, INSTANCE_HYPERVISOR, INSTANCE_GPU_NAME, INSTANCE_GPU_MANUFACTURER, INSTANCE_GPU_COUNT,
    INSTANCE_GPU_MEMORY, INSTANCE_LOCAL_NVME, INSTANCE_EBS_BANDWIDTH,
})
WELL_KNOWN = INSTANCE_TYPE_KEYS | {CAPACITY_TYPE_LABEL, CAPACITY_RESERVATION_ID, CAPACITY_RESERVATION_TYPE,
                                   EC2NODECLASS_LABEL, ZONE_ID_LABEL}

MIB = 2.0**20
VM_MEMORY_OVERHEAD = 0.075
DEFAULT_EPHEMERAL = 20 * 2.0**30
_NAME = re.compile(r"^(?P<family>(?P<category>[a-z]+)-?(?P<generation>[0-9]+)?[a-z0-9-]*)\.(?P<size>[a-z0-9-]+)$")
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}

# (AWS GPU name, per-GPU MiB) → kubegpu.gpu catalog key, so MIG / time-slicing / MPS capacity is known per type
_GPU_MODELS: dict[tuple[str, int | None], str] = {
    ("a10g", None): "A10G", ("t4", None): "T4", ("l4", None): "L4", ("l40s", None): "L40S",
    ("a100", 40960): "A100-SXM4-40GB", ("a100", 81920): "A100-SXM4-80GB", ("h100", None): "H100-SXM5-80GB",
    ("h200", None): "H200-141GB", ("b200", None): "B200-180GB",
}


def label_value(text: str) -> str:
    """Karpenter's transform for GPU names and manufacturers: lowercase, spaces to dashes."""
    return text.strip().lower().replace(" ", "-")


def parse_name(name: str) -> dict[str, str]:
    """category / family / generation / size from an EC2 type name (`g5.12xlarge` → g, g5, 5, 12xlarge)."""
    match = _NAME.match(name)
    if not match:
        return {}
    out = {INSTANCE_FAMILY: match.group("family"), INSTANCE_CATEGORY: match.group("category"),
           INSTANCE_SIZE: match.group("size")}
    if match.group("generation"):
        out[INSTANCE_GENERATION] = match.group("generation")
    return out


def single_gpu(info: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The GPU entry when the type has exactly one GPU kind (Karpenter labels GPUs only then)."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    return gpus[0] if len(gpus) == 1 else None


def gpu_model_key(info: Mapping[str, Any]) -> str | None:
    gpu = single_gpu(info)
    if gpu is None or label_value(str(gpu.get("Manufacturer", ""))) != "nvidia":
        return None
    name = label_value(str(gpu.get("Name", "")))
    memory = int((gpu.get("MemoryInfo") or {}).get("SizeInMiB") or 0)
    return _GPU_MODELS.get((name, memory)) or _GPU_MODELS.get((name, None))


def architecture(info: Mapping[str, Any]) -> str | None:
    archs = (info.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    for arch in archs:
        if arch in _ARCH:
            return _ARCH[arch]
    return None


def type_labels(info: Mapping[str, Any]) -> dict[str, str]:
    """The `karpenter.k8s.aws/*` labels of one DescribeInstanceTypes entry."""
    name = str(info["InstanceType"])
    out = parse_name(name)
    out[INSTANCE_CPU] = str(int((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0))
    out[INSTANCE_MEMORY] = str(int((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0))
    manufacturer = (info.get("ProcessorInfo") or {}).get("Manufacturer")
    if manufacturer:
        out[INSTANCE_CPU_MANUFACTURER] = label_value(str(manufacturer))
    if info.get("Hypervisor"):
        out[INSTANCE_HYPERVISOR] = str(info["Hypervisor"])
    gpu = single_gpu(info)
    if gpu is not None:
        out[INSTANCE_GPU_NAME] = label_value(str(gpu.get("Name", "")))
        out[INSTANCE_GPU_MANUFACTURER] = label_value(str(gpu.get("Manufacturer", "")))
        out[INSTANCE_GPU_COUNT] = str(int(gpu.get("Count") or 0))
        out[INSTANCE_GPU_MEMORY] = str(int((gpu.get("MemoryInfo") or {}).get("SizeInMiB") or 0))
    storage = info.get("InstanceStorageInfo") or {}
    if storage.get("NvmeSupport") in ("supported", "required") and storage.get("TotalSizeInGB"):
        out[INSTANCE_LOCAL_NVME] = str(int(storage["TotalSizeInGB"]))
    ebs = info.get("EbsInfo") or {}
    if ebs.get("EbsOptimizedSupport") == "default":
        bandwidth = (ebs.get("EbsOptimizedInfo") or {}).get("MaximumBandwidthInMbps")
        if bandwidth:
            out[INSTANCE_EBS_BANDWIDTH] = str(int(bandwidth))
    return out


def eni_limited_pods(info: Mapping[str, Any]) -> int | None:
    """ENIs (of the default network card) × (IPv4 per ENI − 1) + 2; None when NetworkInfo lacks the numbers."""
    net = info.get("NetworkInfo") or {}
    per_eni = net.get("Ipv4AddressesPerInterface")
    enis = net.get("MaximumNetworkInterfaces")
    cards = net.get("NetworkCards") or []
    default = net.get("DefaultNetworkCardIndex", 0)
    for card in cards:
        if card.get("NetworkCardIndex") == default and card.get("MaximumNetworkInterfaces"):
            enis = card["MaximumNetworkInterfaces"]
    if not per_eni or not enis:
        return None
    return int(enis) * (int(per_eni) - 1) + 2


def type_capacity(info: Mapping[str, Any], max_pods: int | None = None) -> dict[str, float]:
    """cpu, memory (minus Karpenter's 7.5 % VM overhead), pods, ephemeral-storage and GPUs by vendor resource."""
    mib = float((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0)
    memory = (mib - math.ceil(mib * VM_MEMORY_OVERHEAD)) * MIB
    pods = max_pods if max_pods is not None else (eni_limited_pods(info) or 110)
    out = {"cpu": float((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0), "memory": memory,
           "pods": float(pods), "ephemeral-storage": DEFAULT_EPHEMERAL}
    for gpu in (info.get("GpuInfo") or {}).get("Gpus") or []:
        vendor = label_value(str(gpu.get("Manufacturer", "")))
        resource = {"nvidia": GPU_RESOURCE, "amd": "amd.com/gpu"}.get(vendor)
        if resource:
            out[resource] = out.get(resource, 0.0) + float(gpu.get("Count") or 0)
    return out


def kube_reserved(cpu: float, pods: float) -> dict[str, float]:
    """Karpenter's default kube-reserved (CPU by ranges, 11 MiB per pod + 255 MiB) plus the 100Mi eviction line."""
    millis = 0.0
    for low, high, share in ((0, 1000, 0.06), (1000, 2000, 0.01), (2000, 4000, 0.005), (4000, math.inf, 0.0025)):
        cores = cpu * 1000
        if cores > low:
            millis += (min(cores, high) - low) * share
    return {"cpu": millis / 1000, "memory": (11 * pods + 255 + 100) * MIB}
