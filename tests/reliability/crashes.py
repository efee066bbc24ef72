"""A world the autoscaler can be killed in at any write, and the checks a new leader's passes must satisfy.

`World` runs the real `Autoscaler` (virtual clock, `MemoryCluster`) next to a stand-in kube-scheduler (binds pending
pods), a ReplicaSet (recreates evicted pods) and, for the AWS provider, a kubelet (registers a Node for each
instance). Every write the autoscaler sends — to the cluster, and EC2's CreateFleet and TerminateInstances — is
counted once it has landed; with `crash_at` set, the write with that number lands and then the process dies
(`Crash`, which no stage catches). `restart` drops everything the dead process held in memory and starts a fresh
controller, provider included, as another replica on the same store: it becomes leader once the dead one's Lease
expires.

`problems` is what must be empty once the new leader's passes have settled: no orphan `kubegpu.io/disrupted` taint,
no NodeClaim stuck in termination or left with a record of an unfinished act, no instance without a NodeClaim (a
kwok Node, or a running EC2 instance), no pod lost (every replicated pod running on a live node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
from kubegpu.autoscaler.objects import has_taint, is_true
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.autoscaler.termination import REASON_ANNOTATION
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.leader import LeaderElector
from kubegpu.scheduling import fits, node_info

LEASE_S = 15.0
UNCOUNTED = frozenset({"Event", "Lease"})   # records of what happened, not state a crash can leave half written


class Crash(BaseException):
    """The autoscaler process died here (a BaseException: no stage's error handling catches it)."""


class Writes:
    """The count of the autoscaler's landed writes since `arm`, and the kill switch."""

    def __init__(self) -> None:
        self.armed = False
        self.crash_at: int | None = None
        self.log: list[str] = []

    def arm(self, crash_at: int | None) -> None:
        self.armed, self.crash_at, self.log = True, crash_at, []

    def landed(self, what: str) -> None:
        if not self.armed:
            return
        self.log.append(what)
        if len(self.log) == self.crash_at:
            self.crash_at = None   # one death per run
            raise Crash(what)


class Counted:
    """`target` whose named write methods report to `writes` once they return (the write landed)."""

    def __init__(self, target: Any, writes: Writes, verbs: tuple[str, ...],
                 describe: Callable[[str, tuple[Any, ...], dict[str, Any]], str | None]) -> None:
        self._target, self._writes, self._verbs, self._describe = target, writes, verbs, describe

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._verbs:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            what = self._describe(name, args, kwargs)
            if what is not None:
                self._writes.landed(what)
            return result

        return counted


def cluster_write(verb: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    kind = args[0]["kind"] if verb == "create" else args[0]
    if kind in UNCOUNTED:
        return None
    name = (args[0].get("metadata") or {}).get("name") if verb == "create" else args[1]
    return f"{verb} {kind} {name}"


class World:
    """The cluster, the clock, the stand-ins for kube-scheduler, a ReplicaSet and (AWS) the kubelet, and the
    autoscaler replica that leads now."""

    def __init__(self, make_provider: Callable[[Any, VirtualClock, Writes], Any], clock: VirtualClock | None = None,
                 kubelet: Callable[[World], None] | None = None,
                 make_upkeep: Callable[[Any, VirtualClock], list[Any]] | None = None, **options: Any) -> None:
        self.clock = clock or VirtualClock(1_000_000.0)
        self.make_upkeep = make_upkeep
        self.store = MemoryCluster(self.clock)
        self.writes = Writes()
        self.make_provider = make_provider
        self.kubelet = kubelet
        self.options = Options(**{"validation_delay": 0.0, "replacement_timeout": 120.0, **options})
        self.replicated: dict[str, dict[str, Any]] = {}
        self.lines: list[str] = []
        self.generation = 0
        self.replicas = 0
        self.scaler = self._replica()

    def _replica(self) -> Autoscaler:
        self.replicas += 1
        cluster = Counted(self.store, self.writes, ("create", "patch", "delete"), cluster_write)
        provider = self.make_provider(cluster, self.clock, self.writes)
        elector = LeaderElector(self.store, f"replica-{self.replicas}", LEASE_NAME, lease_duration=LEASE_S)
        upkeep = self.make_upkeep(provider, self.clock) if self.make_upkeep is not None else []
        return Autoscaler(cluster, provider, self.clock, self.options, log=self.lines.append,  # type: ignore[arg-type]
                          elector=elector, upkeep=upkeep)

    def restart(self) -> None:
        """The leader died: its informers, its provider's memory, its pending decisions are gone."""
        self.scaler.close()
        self.scaler = self._replica()

    # -- the rest of the cluster ----------------------------------------------------------------------------------
    def add_replicated(self, obj: dict[str, Any]) -> None:
        self.replicated[obj["metadata"]["name"]] = obj
        self.store.create(obj)

    def recreate_evicted(self) -> None:
        present = {p["metadata"]["name"] for p in self.store.list("Pod")}
        for name, template in self.replicated.items():
            if name not in present:
                self.generation += 1
                self.store.create({**template, "metadata": {**template["metadata"], "uid": f"{name}-{self.generation}"},
                                   "spec": {k: v for k, v in template["spec"].items() if k != "nodeName"},
                                   "status": {"phase": "Pending"}})

    def bind_pending(self) -> None:
        """kube-scheduler's part: each pending pod to the first Ready node it fits (taints included)."""
        pods = self.store.list("Pod")
        infos = []
        for node in self.store.list("Node"):
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (node.get("status") or {}).get("conditions") or [])
            if ready and not node["metadata"].get("deletionTimestamp"):
                infos.append(node_info(node, [p for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"]
                                              and p["status"].get("phase") not in ("Succeeded", "Failed")]))
        for p in pods:
            if p["spec"].get("nodeName") or p["status"].get("phase") != "Pending":
                continue
            for info in infos:
                if fits(p, info).ok and not _repelled(p, info.pods):
                    info.add_pod(p)
                    ns = p["metadata"]["namespace"]
                    self.store.patch("Pod", p["metadata"]["name"], {"spec": {"nodeName": info.name}}, namespace=ns)
                    self.store.patch("Pod", p["metadata"]["name"], {"status": {"phase": "Running"}}, namespace=ns,
                                     subresource="status")
                    break

    def finish(self, name: str) -> None:
        self.replicated.pop(name, None)
        self.store.patch("Pod", name, {"status": {"phase": "Succeeded"}}, subresource="status")

    def tick(self, seconds: float = 1.0) -> None:
        """One second: the autoscaler's pass, then the other controllers'."""
        self.clock.advance(seconds)
        self.scaler.step()
        if self.kubelet is not None:
            self.kubelet(self)
        self.recreate_evicted()
        self.bind_pending()

    def run_until(self, done: Callable[[], bool], seconds: float) -> bool:
        end = self.clock.now() + seconds
        while self.clock.now() < end:
            self.tick()
            if done():
                return True
        return False

    # -- what must hold -------------------------------------------------------------------------------------------
    def problems(self, instances: Callable[[World], set[str]]) -> list[str]:
        """Everything wrong with the settled state (empty: nothing); `instances`: the providerIDs the cloud runs."""
        out: list[str] = []
        claims = self.store.list("NodeClaim")
        nodes = {n["metadata"]["name"]: n for n in self.store.list("Node")}
        owned = {(c.get("status") or {}).get("providerID") for c in claims}
        for claim in claims:
            meta, name = claim["metadata"], claim["metadata"]["name"]
            if meta.get("deletionTimestamp"):
                out.append(f"nodeclaim {name} stuck in termination")
            elif not is_true(claim, "Initialized"):
                out.append(f"nodeclaim {name} never initialized")
            for key in (L.DISRUPTION_ANNOTATION, REASON_ANNOTATION):
                if key in (meta.get("annotations") or {}):
                    out.append(f"nodeclaim {name} keeps an unfinished record {key}")
        for name, node in nodes.items():
            if has_taint(node, L.DISRUPTED_TAINT):
                out.append(f"node {name}: orphan {L.DISRUPTED_TAINT['key']} taint")
            if node["metadata"].get("deletionTimestamp"):
                out.append(f"node {name} stuck deleting (finalizers {node['metadata'].get('finalizers')})")
            if (node.get("spec") or {}).get("providerID") not in owned:
                out.append(f"node {name} has no NodeClaim")
        for provider_id in sorted(instances(self) - owned):
            out.append(f"instance {provider_id} leaked (no NodeClaim)")
        pods = {p["metadata"]["name"]: p for p in self.store.list("Pod")}
        for name in self.replicated:
            pod = pods.get(name)
            where = (pod or {}).get("spec", {}).get("nodeName")
            if pod is None or where not in nodes or pod["status"].get("phase") != "Running":
                out.append(f"pod {name} lost (on {where!r})")
        return out


CATEGORIES = (("orphan", "orphan taints"), ("no NodeClaim", "leaked instances"), ("leaked", "leaked instances"),
              ("pod ", "pods lost"), ("nodeclaim ", "stuck NodeClaims"), ("stuck", "stuck NodeClaims"))


def category(problem: str) -> str:
    """Which of the four counts a `World.problems` line falls under."""
    return next(name for key, name in CATEGORIES if key in problem)


def _repelled(pod: dict[str, Any], there: list[dict[str, Any]]) -> bool:
    """kube-scheduler's required pod anti-affinity on the hostname (all these tests use): a pod matching a term's
    labels already runs on the node."""
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    for term in terms:
        wanted = (term.get("labelSelector") or {}).get("matchLabels") or {}
        if term.get("topologyKey") == L.HOSTNAME_LABEL and any(
                all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
                for p in there):
            return True
    return False


def kwok_provider(types: list[Any]) -> Callable[[Any, VirtualClock, Writes], SimulatedProvider]:
    return lambda cluster, clock, _writes: SimulatedProvider(cluster, types, clock, registration_delay=5.0)


def kwok_instances(world: World) -> set[str]:
    """A kwok instance is its Node."""
    return {n["spec"]["providerID"] for n in world.store.list("Node")
            if (n.get("metadata") or {}).get("labels", {}).get(L.SIMULATED_NODE_LABEL) == "true"}
