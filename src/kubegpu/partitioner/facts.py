"""What the partitioner controller reads of each Pod and Node, derived once per object version.

Every pass looks at every Node and Pod, but between two passes (5 s) only a few change. What a pass needs of each
object (could a re-cut help the pod, where is it bound; how the node opted in, whether a plan is in flight, the
agent's report) is derived once per resourceVersion (`VersionMemo`) and, where the cluster is read through an
informer, kept current from its change journal (`ObjectIndex`), so a pass costs what changed, not what exists —
the controller at fleet scale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubegpu.errors import KubegpuError, NotFoundError
from kubegpu.gpu.catalog import get_model
from kubegpu.kube import Cluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.annotations import node_mode
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, Mode, MpsSlice, NodeInput, is_partition_resource
from kubegpu.scheduling import is_finished, is_scheduling_gated, pod_key, pod_requests

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name), as the informer and the stores sort objects


def could_help(pod: Mapping[str, Any]) -> bool:
    """A pending, unbound pod asking for a MIG or MPS slice, not owned by a DaemonSet, not nominated anywhere."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or status.get("nominatedNodeName"):
        return False
    if (status.get("phase") or "Pending") != "Pending" or is_scheduling_gated(pod):
        return False
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if any(o.get("kind") == "DaemonSet" for o in owners):
        return False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return False
    try:
        return any(is_partition_resource(r) for r in pod_requests(pod))
    except KubegpuError:
        return False


def in_flight(node: Mapping[str, Any]) -> bool:
    """The node has been given a plan its agent has not reported yet."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    spec = annotations.get(ann.SPEC_PLAN)
    return spec is not None and annotations.get(ann.STATUS_PLAN) != spec


def node_input(node: dict[str, Any], pods: Iterable[dict[str, Any]]) -> tuple[NodeInput | None, list[str]]:
    """The planner's view of a node, rebuilt from the agent's status annotations (None until it has reported)."""
    mode = node_mode(node)
    if mode is None:
        return None, []
    gpus, errors = reported_gpus(node, mode)
    if not gpus:
        return None, errors
    return NodeInput(name=node["metadata"]["name"], mode=mode, node=node, gpus=gpus, pods=tuple(pods)), errors


class ReportMemo:
    """What reading agents' reports remembers between nodes and passes: each GPU's reading by its annotations
    (`ann.parse_status`'s memo) and the planner's input made of it. A node's report is read again whenever one of
    its GPUs changed; the others read as before."""

    def __init__(self) -> None:
        self.status: dict[tuple[str, int, str, str, str], ann.ReportedGpu | str] = {}
        self.inputs: dict[int, tuple[ann.ReportedGpu, GpuInput]] = {}  # id of a remembered reading → its input


def reported_gpus(node: Mapping[str, Any], mode: str, memo: ReportMemo | None = None
                  ) -> tuple[tuple[GpuInput, ...], list[str]]:
    """The GPUs the agent reported in the node's status annotations, and the lines it could not read."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    reported, errors = ann.parse_status(annotations, mode, memo.status if memo is not None else None)
    gpus = []
    for gpu in reported:
        if memo is not None:
            found = memo.inputs.get(id(gpu))
            if found is not None and found[0] is gpu:
                gpus.append(found[1])
                continue
        try:
            model = get_model(gpu.model_key)
        except NotFoundError:
            model = None
        made = GpuInput(
            index=gpu.index, model_key=gpu.model_key, model=model,
            instances=tuple(CurrentInstance(i.profile_id, i.start, used) for i, used in gpu.instances),
            slices=tuple(MpsSlice(gb, used) for gb, used in gpu.slices),
        )
        if memo is not None:
            if len(memo.inputs) > 100_000:
                memo.inputs.clear()
            memo.inputs[id(gpu)] = (gpu, made)
        gpus.append(made)
    return tuple(gpus), errors


class VersionMemo(Generic[T]):
    """What a pass derives from each object, kept until the object's resourceVersion changes.

    Every pass re-reads every Node and Pod; between two passes (5 s) only a few change, so deriving each one's facts
    (is the pod one a re-cut could help, where is it bound; what did the node's agent report) once per version
    saves the controller most of its work at fleet scale. Objects are told apart by uid (by namespace and name
    without one); an object without a resourceVersion (hand-built in a test) is derived afresh each time."""

    def __init__(self, derive: Callable[[dict[str, Any]], T]) -> None:
        self._derive = derive
        self._seen: dict[Any, tuple[str, T]] = {}
        self._same: dict[int, tuple[dict[str, Any], T]] = {}  # id → the very object last seen, and its facts

    def of(self, objects: list[dict[str, Any]]) -> list[T]:
        """Each object's facts, in order; what the memo keeps is exactly these objects' (the rest are gone).

        An informer that hands out its cached objects without copying (`InformedCluster(copy=False)`) gives the
        very same dict again until the object changes: that is recognised first, by identity, at the cost of one
        lookup; a copy is recognised by its uid and resourceVersion."""
        seen, same, derive = self._seen, self._same, self._derive
        kept: dict[Any, tuple[str, T]] = {}
        kept_same: dict[int, tuple[dict[str, Any], T]] = {}
        out = []
        for obj in objects:
            hit = same.get(id(obj))
            if hit is not None and hit[0] is obj:
                kept_same[id(obj)] = hit
                out.append(hit[1])
                continue
            meta = obj.get("metadata") or {}
            version = meta.get("resourceVersion")
            if version is None:
                out.append(derive(obj))
                continue
            key = meta.get("uid") or (meta.get("namespace"), meta.get("name"))
            found = seen.get(key)
            if found is None or found[0] != version:
                found = (version, derive(obj))
            kept[key] = found
            kept_same[id(obj)] = (obj, found[1])
            out.append(found[1])
        self._seen, self._same = kept, kept_same
        return out


@dataclass(frozen=True)
class PodFacts:
    """What a pass needs of a pod: its key, whether a re-cut could help it, and the node it holds resources on."""

    key: str
    helps: bool
    bound_to: str | None  # its node while it is bound and not finished


def pod_facts(pod: dict[str, Any]) -> PodFacts:
    where = (pod.get("spec") or {}).get("nodeName")
    return PodFacts(pod_key(pod), could_help(pod), where if where and not is_finished(pod) else None)


class NodeFacts:
    """What a pass needs of a node: how it opted in, a bad opt-in label, a plan in flight, and (read only when a
    plan is made, then kept) the agent's report."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.mode: Mode | None = node_mode(node)
        value = ((node.get("metadata") or {}).get("labels") or {}).get(ann.PARTITIONING_LABEL)
        self.bad_label = (f"label {ann.PARTITIONING_LABEL}: must be mig or mps, not {value!r}; node left alone"
                          if value is not None and self.mode is None else None)
        self.in_flight = in_flight(node)
        self._report: tuple[tuple[GpuInput, ...], list[str]] | None = None

    def report(self, memo: ReportMemo | None = None) -> tuple[tuple[GpuInput, ...], list[str]]:
        """The GPUs the agent reported and the lines it could not read (`reported_gpus`)."""
        if self._report is None:
            self._report = reported_gpus(self.node, self.mode, memo) if self.mode is not None else ((), [])
        return self._report


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class ObjectIndex(Generic[T]):
    """Every object of one kind with its facts, brought up to date at the start of each pass.

    Through an informer (`InformedCluster.changes`) only the objects that changed since the last pass are read and
    derived again, as a client-go controller's event handlers would; from any other cluster (or when the informer
    says to start over) the kind is listed and each object's facts come from a `VersionMemo`."""

    def __init__(self, kind: str, derive: Callable[[dict[str, Any]], T]) -> None:
        self.kind = kind
        self._derive = derive
        self._memo = VersionMemo(derive)
        self._token: int | None = None
        self.items: dict[Key, tuple[dict[str, Any], T]] = {}  # in no particular order: sort where order matters

    def refresh(self, cluster: Cluster) -> list[tuple[Key, T | None]] | None:
        """Read what changed: each changed key with its facts before (None: new), or None when everything was
        read again (then rebuild whatever is kept from `items`)."""
        changes = getattr(cluster, "changes", None)
        if changes is not None:
            token, changed = changes(self.kind, self._token)
            self._token = token
            if changed is not None:
                items, derive = self.items, self._derive
                out = []
                for key, obj in changed:
                    before = items.pop(key, None) if obj is None else items.get(key)
                    if obj is not None:
                        items[key] = (obj, derive(obj))
                    out.append((key, None if before is None else before[1]))
                return out
        objects = cluster.list(self.kind)
        self.items = {object_key(obj): (obj, facts)
                      for obj, facts in zip(objects, self._memo.of(objects), strict=True)}
        return None
