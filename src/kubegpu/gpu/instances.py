"""Cloud instance types with NVIDIA GPUs, as facts: which catalog model and how many GPUs each one holds, and the
labels that name the GPU on such a node (Karpenter's `karpenter.k8s.aws/instance-gpu-*`, GFD's `nvidia.com/gpu.*`).

A pod can pin a GPU model without naming it: `node.kubernetes.io/instance-type: p5e.48xlarge` or Karpenter's
`karpenter.k8s.aws/instance-gpu-name: h200` put it on an H200 as surely as GFD's product label. The quota charge
(`kubegpu.sharing.charges`) must see through every such pin, so the facts live here, below every consumer. The
autoscaler's shipped catalogue (`kubegpu.autoscaler.data`) lists a subset of these types; a test keeps the two in
agreement.

Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubegpu.gpu.catalog import CATALOG, GpuModel

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
BETA_INSTANCE_TYPE_LABEL = "beta.kubernetes.io/instance-type"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
KARPENTER_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
KARPENTER_FAMILY = "karpenter.k8s.aws/instance-family"
KARPENTER_SIZE = "karpenter.k8s.aws/instance-size"
KUBEGPU_FAMILY = "kubegpu.io/instance-family"
KUBEGPU_GPU_COUNT = "kubegpu.io/instance-gpu-count"

# catalog key → the GPU name EC2 reports, as Karpenter labels it (lowercase)
KARPENTER_GPU_NAMES: Mapping[str, str] = {
    "A100-SXM4-40GB": "a100", "A100-SXM4-80GB": "a100", "H100-SXM5-80GB": "h100", "H200-141GB": "h200",
    "B200-180GB": "b200", "T4": "t4", "A10G": "a10g", "L4": "l4", "L40S": "l40s",
}

# instance type → (catalog key, GPUs): AWS's GPU families
GPU_INSTANCE_TYPES: Mapping[str, tuple[str, int]] = {
    "p4d.24xlarge": ("A100-SXM4-40GB", 8), "p4de.24xlarge": ("A100-SXM4-80GB", 8),
    "p5.48xlarge": ("H100-SXM5-80GB", 8), "p5e.48xlarge": ("H200-141GB", 8), "p5en.48xlarge": ("H200-141GB", 8),
    "p6-b200.48xlarge": ("B200-180GB", 8),
    **{f"g4dn.{size}": ("T4", count) for size, count in (("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1),
                                                          ("8xlarge", 1), ("12xlarge", 4), ("16xlarge", 1))},
    **{f"g5.{size}": ("A10G", count) for size, count in (("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1),
                                                         ("8xlarge", 1), ("12xlarge", 4), ("16xlarge", 1),
                                                         ("24xlarge", 4), ("48xlarge", 8))},
    **{f"g6.{size}": ("L4", count) for size, count in (("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1),
                                                       ("8xlarge", 1), ("12xlarge", 4), ("24xlarge", 4),
                                                       ("48xlarge", 8))},
    **{f"g6e.{size}": ("L40S", count) for size, count in (("xlarge", 1), ("12xlarge", 4), ("48xlarge", 8))},
}


def gfd_model_labels(model: GpuModel) -> dict[str, str]:
    """The GFD labels that name a node's GPU model: product (NVML's name, spaces as dashes) and memory (MiB)."""
    return {GPU_PRODUCT_LABEL: model.product_name.replace(" ", "-"), GPU_MEMORY_LABEL: str(model.memory_mib)}


def instance_type_labels(name: str) -> dict[str, str]:
    """The GPU-naming labels a node of instance type `name` carries (GFD's, Karpenter's and the autoscaler's, with
    the GPU memory as the catalog has it); {} for a type these facts do not list."""
    found = GPU_INSTANCE_TYPES.get(name)
    if found is None:
        return {}
    key, count = found
    model = CATALOG[key]
    family, _, size = name.partition(".")
    labels = {INSTANCE_TYPE_LABEL: name, BETA_INSTANCE_TYPE_LABEL: name, KARPENTER_FAMILY: family,
              KARPENTER_SIZE: size, KUBEGPU_FAMILY: family, KUBEGPU_GPU_COUNT: str(count),
              KARPENTER_GPU_MANUFACTURER: "nvidia", KARPENTER_GPU_COUNT: str(count),
              KARPENTER_GPU_MEMORY: str(model.memory_mib), **gfd_model_labels(model)}
    if key in KARPENTER_GPU_NAMES:
        labels[KARPENTER_GPU_NAME] = KARPENTER_GPU_NAMES[key]
    return labels
