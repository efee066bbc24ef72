"""What the autoscaler needs on AWS beyond the `CloudProvider` operations: the provider's upkeep tasks, each its own
stage of the controller (`kubegpu.autoscaler.controller.Upkeep`), so a slow or failing one holds up nothing else.

- `NodeClassSync`: EC2NodeClasses read from the cluster (from the informers; or a file, then there is no such task)
  and each resolved one's status (subnets, security groups, AMIs) written back when it changed.
- `Interruptions`: the SQS interruption queue (`interruption.py`).
- `GarbageCollection`: instances that carry our tags but no NodeClaim are terminated, and their Nodes deleted —
  every 10 s for the first 20 runs, then every 2 min, as Karpenter's controller runs.

`aws_autoscaler` assembles the controller with the `AwsProvider` and these tasks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws.interruption import InterruptionHandler
from kubegpu.autoscaler.aws.nodeclass import KIND, PLURAL, EC2NodeClass, parse_ec2nodeclass
from kubegpu.autoscaler.controller import Autoscaler, Options, Upkeep
from kubegpu.autoscaler.objects import name_of
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound
from kubegpu.kube.retry import update_with_retry

if TYPE_CHECKING:
    from kubegpu.autoscaler.aws.provider import AwsProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.kube.leader import LeaderElector

GC_FAST, GC_SLOW, GC_FAST_PASSES = 10.0, 120.0, 20


def register_kind() -> None:
    """Let the cluster interface read and write EC2NodeClass objects."""
    from kubegpu.kube.resources import ResourceKind
    from kubegpu.kube.resources import register_kind as register

    register(ResourceKind(KIND, L.GROUP, "v1", PLURAL, namespaced=False, status_subresource=True,
                          strategic_merge=False))


class NodeClassSync:
    """EC2NodeClasses from the cluster; each resolved one gets its status (subnets, AMIs, ...) written back."""

    name = "nodeclasses"
    kinds: tuple[str, ...] = (KIND,)

    def __init__(self, provider: AwsProvider, log: Callable[[str], None] | None = None) -> None:
        register_kind()
        self.aws = provider
        self.log = log or (lambda _line: None)

    def run(self, scaler: Autoscaler) -> None:
        try:
            raw = scaler.cluster.list(KIND)
        except NotFound:
            return
        classes: dict[str, EC2NodeClass] = {}
        for item in raw:
            try:
                classes[name_of(item)] = parse_ec2nodeclass(item)
            except KubegpuError as exc:
                self.log(str(exc))
        self.aws.nodeclasses = classes
        for name in classes:
            try:
                # ready or not: a class that is not shows why in its conditions, as Karpenter's do
                status: dict[str, Any] = self.aws.resolved(name).status.model_dump(mode="json", exclude_none=True)
            except KubegpuError as exc:
                self.log(str(exc))
                continue
            current = next((i.get("status") for i in raw if name_of(i) == name), None)
            if current != status:
                scaler.cluster.patch(KIND, name, {"status": status}, subresource="status")


class Interruptions:
    """The interruption queue, handled against the controller's provisioner and termination."""

    name = "interruption"
    kinds: tuple[str, ...] = ()

    def __init__(self, provider: AwsProvider, queue: str, log: Callable[[str], None] | None = None) -> None:
        self.aws = provider
        self.queue = queue
        self.log = log or (lambda _line: None)
        self.handler: InterruptionHandler | None = None

    def run(self, scaler: Autoscaler) -> None:
        if self.handler is None:
            self.handler = InterruptionHandler(self.aws, self.queue, scaler.cluster, scaler.provisioner,
                                               scaler.termination, scaler.clock, self.log)
        self.handler.reconcile(scaler.state.snapshot())


class GarbageCollection:
    """Terminate our tagged instances that no NodeClaim owns, and delete their Nodes."""

    name = "garbage-collection"
    kinds: tuple[str, ...] = ()

    def __init__(self, provider: AwsProvider, clock: Clock) -> None:
        self.aws = provider
        self.clock = clock
        self._runs = 0
        self._at = -1e18

    def run(self, scaler: Autoscaler) -> None:
        self.collect(scaler)

    def collect(self, scaler: Autoscaler, force: bool = False) -> list[str]:
        now = self.clock.now()
        every = GC_FAST if self._runs < GC_FAST_PASSES else GC_SLOW
        if now - self._at < every and not force:
            return []
        self._at = now
        self._runs += 1
        snapshot = scaler.state.snapshot()
        known = {(c.get("status") or {}).get("providerID") for c in snapshot.nodeclaims}
        scaler.fence("garbage collection")   # it terminates instances: a leader's act
        gone = self.aws.garbage_collect(p for p in known if p)
        for node in snapshot.nodes.values():
            pid = (node.get("spec") or {}).get("providerID") or ""
            if any(pid.endswith(f"/{i}") for i in gone):
                with contextlib.suppress(NotFound):
                    scaler.cluster.delete("Node", name_of(node))
                    # its instance is gone and no NodeClaim's termination will release it: our finalizer goes,
                    # anyone else's stays (a precondition on a fresh read keeps one added meanwhile)
                    update_with_retry(scaler.cluster, "Node", name_of(node), _without_ours)
        return gone


def _without_ours(node: dict[str, Any]) -> dict[str, Any] | None:
    finalizers = (node.get("metadata") or {}).get("finalizers") or []
    if L.TERMINATION_FINALIZER not in finalizers:
        return None
    return {"metadata": {"finalizers": [f for f in finalizers if f != L.TERMINATION_FINALIZER] or None}}


def aws_upkeep(provider: AwsProvider, clock: Clock, *, interruption_queue: str | None = None,
               nodeclasses_from_cluster: bool = True, log: Callable[[str], None] | None = None) -> list[Upkeep]:
    tasks: list[Upkeep] = []
    if nodeclasses_from_cluster:
        tasks.append(NodeClassSync(provider, log))
    if interruption_queue:
        tasks.append(Interruptions(provider, interruption_queue, log))
    tasks.append(GarbageCollection(provider, clock))
    return tasks


def aws_autoscaler(cluster: Cluster, provider: AwsProvider, clock: Clock, options: Options | None = None,
                   log: Callable[[str], None] | None = None, elector: LeaderElector | None = None, *,
                   interruption_queue: str | None = None, nodeclasses_from_cluster: bool = True) -> Autoscaler:
    """The autoscaler handed the AWS provider and its upkeep tasks."""
    upkeep = aws_upkeep(provider, clock, interruption_queue=interruption_queue,
                        nodeclasses_from_cluster=nodeclasses_from_cluster, log=log)
    return Autoscaler(cluster, provider, clock, options, log, elector, upkeep=upkeep)


def garbage_collection(scaler: Autoscaler) -> GarbageCollection | None:
    return next((t for t in scaler.upkeep if isinstance(t, GarbageCollection)), None)
