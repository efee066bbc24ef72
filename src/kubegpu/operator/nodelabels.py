"""The node labels the operator sets and removes (GPU Operator rules), as a pure function of policy and Node.

Only absent or empty labels are filled: a non-empty value belongs to whoever wrote it (the MIG hand-off pauses an
operand with `paused-for-mig-change`, an admin disables one with `false`), and `nvidia.com/gpu.deploy.operands=false`
takes the whole stack off a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubegpu.operator.components import DEPLOY_LABEL_PREFIX, OPERANDS
from kubegpu.operator.policy import ClusterPolicy
from kubegpu.operator.render import block

NFD_GPU_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
GPU_PRESENT = "nvidia.com/gpu.present"
OPERANDS_LABEL = DEPLOY_LABEL_PREFIX + "operands"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_CONFIG = "nvidia.com/mig.config"
GPU_PRODUCT = "nvidia.com/gpu.product"
PARTITIONING_LABEL = "kubegpu.io/gpu-partitioning"
MIG_PRODUCTS = ("a100", "a30", "h100", "h200", "h20", "b200")


@dataclass
class LabelChange:
    set: dict[str, str] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"set": dict(sorted(self.set.items())), "remove": sorted(self.remove)}

    @property
    def empty(self) -> bool:
        return not self.set and not self.remove

    def patch(self) -> dict[str, str | None]:
        """A merge-patch body for metadata.labels (None deletes)."""
        out: dict[str, str | None] = dict(self.set)
        out.update({key: None for key in self.remove})
        return out


def has_gpu(labels: dict[str, str]) -> bool:
    return any(labels.get(key) == "true" for key in NFD_GPU_LABELS) or labels.get(GPU_PRESENT) == "true"


def mig_capable(labels: dict[str, str]) -> bool:
    """`nvidia.com/mig.capable=true`, or without that label a product name of a MIG-capable GPU."""
    if MIG_CAPABLE in labels:
        return labels[MIG_CAPABLE] == "true"
    product = labels.get(GPU_PRODUCT, "").lower()
    return any(name in product for name in MIG_PRODUCTS)


def deploy_labels(policy: ClusterPolicy, labels: dict[str, str]) -> dict[str, bool]:
    """Every deploy label the operator manages → whether this node should carry it. A node opted into dynamic
    partitioning (`kubegpu.io/gpu-partitioning=mig|mps`) runs the partition agent instead of the MIG manager, so
    the two never fight over the same GPUs."""
    partitioned = labels.get(PARTITIONING_LABEL) in ("mig", "mps")
    out: dict[str, bool] = {}
    for op in OPERANDS:
        if op.kind != "DaemonSet" or op.deploy_as is not None:  # rides on another component's label
            continue
        wanted = op.block == "validator" or block(policy, op.block).enabled
        if op.mig_only:
            wanted = wanted and mig_capable(labels) and not partitioned
        if op.component == "partition-agent":
            wanted = wanted and partitioned
        out[op.deploy_label] = wanted
    return out


def node_label_change(policy: ClusterPolicy, labels: dict[str, str]) -> LabelChange:
    change = LabelChange()
    managed = deploy_labels(policy, labels)
    if not has_gpu(labels):
        change.remove = [key for key in managed if key in labels]
        if labels.get(GPU_PRESENT):
            change.remove.append(GPU_PRESENT)
        return change
    if not labels.get(GPU_PRESENT):
        change.set[GPU_PRESENT] = "true"
    if labels.get(OPERANDS_LABEL) == "false":
        change.remove = [key for key in managed if key in labels]
        return change
    for key, wanted in managed.items():
        current = labels.get(key)
        if wanted and not current:
            change.set[key] = "true"
        elif not wanted and current == "true":
            change.remove.append(key)
    if (policy.spec.migManager.enabled and policy.spec.migManager.config.default == "all-disabled"
            and mig_capable(labels) and not labels.get(MIG_CONFIG)):
        change.set[MIG_CONFIG] = "all-disabled"
    return change


def nodes_from(data: Any, source: str) -> list[dict[str, Any]]:
    """Nodes from a YAML list, a `kind: List` (or NodeList), or a single Node."""
    from kubegpu.errors import ConfigError

    if isinstance(data, dict) and data.get("kind") == "Node":
        data = [data]
    elif isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: want a list of Nodes or a kind: List")
    for index, node in enumerate(data):
        if not isinstance(node, dict) or not isinstance(node.get("metadata"), dict) or \
                not node["metadata"].get("name"):
            raise ConfigError(f"{source}: items[{index}].metadata.name: a Node needs a name")
        if not isinstance(node["metadata"].get("labels") or {}, dict):
            raise ConfigError(f"{source}: items[{index}].metadata.labels: must be a mapping")
    return data


def plan_labels(policy: ClusterPolicy, nodes: list[dict[str, Any]]) -> dict[str, LabelChange]:
    return {node["metadata"]["name"]: node_label_change(policy, dict(node["metadata"].get("labels") or {}))
            for node in nodes}
