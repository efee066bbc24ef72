"""NodeClaim lifecycle: Launched → Registered → Initialized, with Karpenter's timeouts, plus expiry.

- Launched: the cloud provider created the instance (providerID, capacity, resolved labels). Insufficient capacity
  deletes the NodeClaim; not launched within 5 min deletes it too.
- Registered: the Node with that providerID exists. We remove `kubegpu.io/unregistered`, label it
  `kubegpu.io/registered=true`, copy the NodeClaim's labels, taints and startupTaints onto it and add the finalizer
  `kubegpu.io/termination`. Not registered within 15 min: the NodeClaim is deleted.
- Initialized: Node Ready, no startup taint left, no `node.kubernetes.io/not-ready`-style taint, and every extended
  resource the NodeClaim was sized for is non-zero in allocatable — a GPU node is not initialized until the device
  plugin has registered its GPUs. Then the node is labelled `kubegpu.io/initialized=true`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.api import parse_duration
from kubegpu.autoscaler.fanout import each_at_once
from kubegpu.autoscaler.objects import condition, created_at, is_true, name_of, same_taint, with_condition
from kubegpu.autoscaler.provider import InsufficientCapacityError
from kubegpu.errors import KubegpuError
from kubegpu.kube.patching import ListEdit, taint_identity, update_lists
from kubegpu.scheduling import parse_quantity

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import ClusterState
    from kubegpu.autoscaler.provider import CloudProvider
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.metrics import AutoscalerMetrics

LAUNCH_TIMEOUT = 5 * 60.0
REGISTRATION_TIMEOUT = 15 * 60.0
EPHEMERAL_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                              "node.cloudprovider.kubernetes.io/uninitialized"})
REPAIR_CONDITION = "AcceleratedHardwareReady"   # the EKS node monitoring agent's name; see docs/autoscaler.md
REPAIR_TOLERATION = 10 * 60.0
REPAIR_MAX_UNHEALTHY = 0.2
LAUNCHES_PER_WORKER = 16   # new launches one pass sends per parallel worker (parallel passes only)
STANDARD_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
HOLD = ListEdit(("metadata", "finalizers"), add=(L.TERMINATION_FINALIZER,))


def initialization_blocker(claim: dict[str, Any], node: dict[str, Any]) -> str | None:
    """Why the node is not Initialized yet (Karpenter's reasons), or None when it is."""
    ready = condition(node, "Ready")
    if ready is None or ready.get("status") != "True":
        return "NodeNotReady"
    taints = (node.get("spec") or {}).get("taints") or []
    startup = (claim.get("spec") or {}).get("startupTaints") or []
    if any(same_taint(t, s) for t in taints for s in startup):
        return "StartupTaintsExist"
    if any(t.get("key") in EPHEMERAL_TAINTS for t in taints):
        return "KnownEphemeralTaintsExist"
    requests = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for name, amount in requests.items():
        if name in STANDARD_RESOURCES or parse_quantity(amount) <= 0:
            continue
        if parse_quantity(allocatable.get(name, 0)) <= 0:
            return "ResourceNotRegistered"
    return None


class Lifecycle:
    def __init__(self, cluster: Cluster, provider: CloudProvider, clock: Clock,
                 terminate: Callable[[dict[str, Any], str], None], log: Callable[[str], None] | None = None,
                 state: ClusterState | None = None, parallelism: int = 1) -> None:
        self.cluster = cluster
        self.state = state
        self.parallelism = max(1, parallelism)
        self.provider = provider
        self.clock = clock
        self.terminate = terminate
        self.log = log or (lambda _line: None)
        self.metrics: AutoscalerMetrics | None = None
        self._unhealthy_since: dict[str, float] = {}
        self._by_provider: dict[str, dict[str, Any]] = {}
        # called with (NodeClaim, Node name) just before registration makes the node usable: the claim's pods are
        # let onto it and nominated to it there (`reservations.py`)
        self.before_register: Callable[[dict[str, Any], str], None] | None = None

    def reconcile(self, claims: list[dict[str, Any]], nodes: dict[str, dict[str, Any]]) -> None:
        """Walk each live NodeClaim one step; launches and registrations run up to `parallelism` at a time, and a
        claim whose step fails is logged and tried again next pass without holding up the others."""
        live = [c for c in claims if not (c.get("metadata") or {}).get("deletionTimestamp")]
        self._by_provider = {pid: n for n in nodes.values() if (pid := (n.get("spec") or {}).get("providerID"))}

        def step(claim: dict[str, Any]) -> None:
            name = name_of(claim)
            if self.state is not None and not self.state.begin_launch(name):
                return  # another stage or pass still has this claim's launch under way
            try:
                self._step(claim, nodes)
            except KubegpuError as exc:
                self.log(f"nodeclaim {name}: {exc}")
            finally:
                if self.state is not None:
                    self.state.end_launch(name)

        busy = [c for c in live if not is_true(c, "Initialized") or L.TERMINATION_FINALIZER not in
                ((c.get("metadata") or {}).get("finalizers") or [])]
        # furthest along first: on a burst, the nodes about to take pods are initialized before the next hundred
        # launches are sent, so the first pods bind a pass earlier (time to the first bound pod)
        busy.sort(key=lambda c: 0 if is_true(c, "Registered") else 1 if is_true(c, "Launched") else 2)
        if self.parallelism > 1:   # and a pass stays short: the rest of a burst's launches go in the next passes
            launched = sum(1 for c in busy if is_true(c, "Launched"))
            busy = busy[:launched + LAUNCHES_PER_WORKER * self.parallelism]
        each_at_once(step, busy, self.parallelism)
        stepped = {id(c) for c in busy}
        for claim in live:   # expiry for the settled ones (the busy ones were checked by their step)
            if id(claim) not in stepped:
                try:
                    self._expire(claim)
                except KubegpuError as exc:
                    self.log(f"nodeclaim {name_of(claim)}: {exc}")
        self.repair(live, nodes)

    def _expire(self, claim: dict[str, Any]) -> bool:
        expire = parse_duration((claim.get("spec") or {}).get("expireAfter") or "720h")
        if expire is not None and self.clock.now() - created_at(claim) >= expire:
            self.terminate(claim, "expired")
            return True
        return False

    def repair(self, claims: list[dict[str, Any]], nodes: dict[str, dict[str, Any]]) -> list[str]:
        """Karpenter's node repair for GPUs: a node whose `AcceleratedHardwareReady` condition is False (critical
        XIDs, set by the discovery agent, `kubegpu discover --kubernetes`) for 10 minutes is replaced. The clock starts
        at the first unhealthy sighting, not the condition's lastTransitionTime (flapping XIDs keep resetting that).
        No repair while more than 20 % of a NodePool's nodes are unhealthy: that is an outage, not a bad GPU. Returns
        the claims sent to termination."""
        now = self.clock.now()
        live = {name_of(c) for c in claims}
        self._unhealthy_since = {k: v for k, v in self._unhealthy_since.items() if k in live}
        unhealthy: dict[str, list[dict[str, Any]]] = {}
        totals: dict[str, int] = {}
        for claim in claims:
            pool = ((claim.get("metadata") or {}).get("labels") or {}).get(L.NODEPOOL_LABEL, "")
            totals[pool] = totals.get(pool, 0) + 1
            node = nodes.get((claim.get("status") or {}).get("nodeName") or "")
            cond = condition(node, REPAIR_CONDITION) if node is not None else None
            if cond is not None and cond.get("status") == "False":
                since = self._unhealthy_since.setdefault(name_of(claim), now)
                if now - since >= REPAIR_TOLERATION:
                    unhealthy.setdefault(pool, []).append(claim)
            else:
                self._unhealthy_since.pop(name_of(claim), None)
        repaired = []
        for pool, bad in unhealthy.items():
            if len(bad) > REPAIR_MAX_UNHEALTHY * totals[pool]:
                self.log(f"nodepool {pool}: {len(bad)}/{totals[pool]} nodes have unhealthy GPUs; not repairing")
                continue
            for claim in bad:
                self.log(f"nodeclaim {name_of(claim)}: {REPAIR_CONDITION}=False for 10m, replacing")
                self.terminate(claim, "unhealthy")
                repaired.append(name_of(claim))
        return repaired

    def _patch_status(self, claim: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write `status` over the claim's; returns the claim as written, a new dict (claims come from the snapshot,
        whose objects are the informer's own and must not be modified)."""
        merged = {**(claim.get("status") or {}), **status}
        self.cluster.patch("NodeClaim", name_of(claim), {"status": merged}, subresource="status")
        return {**claim, "status": merged}

    def _set(self, claim: dict[str, Any], kind: str, status: str, reason: str, message: str = "",
             also: tuple[tuple[str, str, str], ...] = ()) -> dict[str, Any]:
        """Set condition `kind` (and the `also` ones: (kind, status, reason)) in one status write."""
        conditions = (claim.get("status") or {}).get("conditions") or []
        for each, value, why, text in ((kind, status, reason, message), *((k, v, r, "") for k, v, r in also)):
            conditions = with_condition(conditions, each, value, why, self.clock.now(), text)
        if all(is_true({"status": {"conditions": conditions}}, k) for k in ("Launched", "Registered", "Initialized")):
            conditions = with_condition(conditions, "Ready", "True", "Ready", self.clock.now())
        return self._patch_status(claim, {"conditions": conditions})

    def _step(self, claim: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> None:
        age = self.clock.now() - created_at(claim)
        if self._expire(claim):
            return
        finalizers = (claim.get("metadata") or {}).get("finalizers") or []
        if L.TERMINATION_FINALIZER not in finalizers:   # a claim made by hand or by an older release
            update_lists(self.cluster, "NodeClaim", name_of(claim), [HOLD], seen=claim)
        if not is_true(claim, "Launched"):
            self._launch(claim, age)
            return
        node_name = (claim.get("status") or {}).get("nodeName") or ""
        node = nodes.get(node_name)
        provider_id = (claim.get("status") or {}).get("providerID")
        if node is None and provider_id:   # a cloud instance's Node is named by its kubelet: find it by providerID
            node = self._by_provider.get(provider_id)
            node_name = name_of(node) if node is not None else ""
        if not is_true(claim, "Registered"):
            if node is None:
                if age >= REGISTRATION_TIMEOUT:
                    self.log(f"nodeclaim {name_of(claim)}: not registered within 15m, deleting")
                    self.terminate(claim, "registration_timeout")
                elif (condition(claim, "Registered") or {}).get("reason") != "NodeNotFound":
                    self._set(claim, "Registered", "False", "NodeNotFound")   # once, not a write every pass
                return
            self._register(claim, node)
            return
        if not is_true(claim, "Initialized") and node is not None:
            blocker = initialization_blocker(claim, node)
            if blocker is None:
                # a merge patch: only the new label travels, the node's others stay
                self.cluster.patch("Node", node_name, {"metadata": {"labels": {L.INITIALIZED_LABEL: "true"}}})
                self._set(claim, "Initialized", "True", "Initialized")
            elif (condition(claim, "Initialized") or {}).get("reason") != blocker:
                self._set(claim, "Initialized", "False", blocker)

    def _launch(self, claim: dict[str, Any], age: float) -> None:
        if age >= LAUNCH_TIMEOUT and (condition(claim, "Launched") or {}).get("reason") == "LaunchFailed":
            self.terminate(claim, "launch_timeout")
            return
        try:
            launched = self.provider.create(claim)
        except InsufficientCapacityError as exc:
            self.log(str(exc))
            self.terminate(claim, "insufficient_capacity")
            return
        except KubegpuError as exc:
            self._set(claim, "Launched", "False", "LaunchFailed", str(exc))
            return
        labels = launched["metadata"]["labels"]
        self.cluster.patch("NodeClaim", name_of(claim), {"metadata": {"labels": labels}})
        status = dict(launched["status"])
        status["conditions"] = with_condition((claim.get("status") or {}).get("conditions") or [], "Launched",
                                              "True", "Launched", self.clock.now())
        fresh = getattr(self.provider, "launched_node", None)
        node = fresh(status.get("providerID") or "") if fresh is not None else None
        if node is not None:   # the provider made the Node with the instance (kwok): register it now, and write
            # Launched and Registered in one status write instead of one each, a pass apart
            self._register({**claim, "metadata": {**(claim.get("metadata") or {}), "labels": labels},
                            "status": {**(claim.get("status") or {}), **status}}, node)
            return
        self._patch_status(claim, status)

    def _register(self, claim: dict[str, Any], node: dict[str, Any]) -> None:
        """Karpenter's registration writes to the Node in one request: kubegpu's labels, the claim's taints and
        startupTaints (an existing taint of the same key and effect stays as it is), `kubegpu.io/unregistered` gone,
        the termination finalizer. Only those entries, under a resourceVersion precondition (redone from a fresh read
        on 409), so a taint, finalizer or label the kubelet, the node lifecycle controller or a user added after our
        cache's copy stays."""
        if self.before_register is not None:
            self.before_register(claim, name_of(node))
        spec = claim.get("spec") or {}
        node_meta, node_spec = node.get("metadata") or {}, node.get("spec") or {}
        synced = () if (node_meta.get("labels") or {}).get("kubegpu.io/do-not-sync-taints") == "true" else \
            (*(spec.get("taints") or []), *(spec.get("startupTaints") or []))
        taints = ListEdit(("spec", "taints"), add=tuple(synced), remove=(L.UNREGISTERED_TAINT,),
                          identity=taint_identity)
        ours = {**((claim.get("metadata") or {}).get("labels") or {}), L.REGISTERED_LABEL: "true",
                L.NODECLAIM_LABEL: name_of(claim)}
        update_lists(self.cluster, "Node", name_of(node), [taints, HOLD], also={"metadata": {"labels": ours}},
                     seen=node)
        labels = {**(node_meta.get("labels") or {}), **ours}
        if (claim.get("status") or {}).get("nodeName") != name_of(node):
            claim = {**claim, "status": {**(claim.get("status") or {}), "nodeName": name_of(node)}}
        # what still keeps the registered node from Initialized goes in the same status write (Karpenter's one
        # patch per reconcile), so the next pass has nothing to write until the node is initialized
        registered = {**node, "metadata": {**node_meta, "labels": labels},
                      "spec": {**node_spec, "taints": taints.applied(node_spec.get("taints"))}}
        blocker = initialization_blocker(claim, registered)
        also = (("Initialized", "False", blocker),) if blocker is not None and \
            (condition(claim, "Initialized") or {}).get("reason") != blocker else ()
        self._set(claim, "Registered", "True", "Registered", also=also)
        if self.metrics is not None:
            self.metrics.nodes_created.labels(labels.get(L.NODEPOOL_LABEL, ""), labels.get(L.ZONE_LABEL, "")).inc()

