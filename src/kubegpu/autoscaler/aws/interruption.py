"""Interruption handling from an SQS queue fed by EventBridge (Karpenter's interruption controller, GPU-minded).

Message bodies are raw EventBridge events, parsed by (`source`, `detail-type`):
spot interruption warning, rebalance recommendation, instance state-change (stopping / stopped / shutting-down /
terminated), AWS Health scheduled change, and capacity-reservation interruption. For each instance that backs a
NodeClaim the node is cordoned at once and a replacement is pre-spun for its pods (so a 2-minute spot warning is
not spent waiting for a new GPU node to boot); then, except for a rebalance recommendation (an early hint, no
instance is lost yet), the node is drained: pods go in PodDisruptionBudget order and pods annotated
`karpenter.sh/do-not-disrupt` / `kubegpu.io/do-not-disrupt` are left to run until the instance is really gone —
Karpenter drains those too; a training step checkpointing in its last two minutes is worth more than the node.
Once nothing evictable is left the NodeClaim is terminated. A spot interruption also marks that spot offering
unavailable. Every message is deleted after handling, also when unparsable or when no NodeClaim matches; a
message whose handling fails stays in the queue and comes back after the visibility timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.aws.clients import call
from kubegpu.autoscaler.aws.launch import parse_provider_id
from kubegpu.autoscaler.objects import is_daemon_pod, is_reschedulable, name_of
from kubegpu.autoscaler.termination import taint_node
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import parse_json_text
from kubegpu.kube.eviction import evict
from kubegpu.scheduling import is_finished

if TYPE_CHECKING:
    from kubegpu.autoscaler.aws.provider import AwsProvider
    from kubegpu.autoscaler.provisioner import Provisioner, Snapshot
    from kubegpu.autoscaler.termination import Termination
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster

SPOT_INTERRUPTED = "spot_interrupted"
REBALANCE = "rebalance_recommendation"
INSTANCE_STOPPED = "instance_stopped"
INSTANCE_TERMINATED = "instance_terminated"
# On a NodeClaim being drained for an interruption: the event kind (what a new leader needs to finish the drain)
INTERRUPTION_ANNOTATION = "kubegpu.io/interruption"
SCHEDULED_CHANGE = "scheduled_change"
RESERVATION_INTERRUPTED = "capacity_reservation_interrupted"
DO_NOT_DISRUPT = ("karpenter.sh/do-not-disrupt", L.DO_NOT_DISRUPT_ANNOTATION)
_STATES = {"stopping": INSTANCE_STOPPED, "stopped": INSTANCE_STOPPED, "shutting-down": INSTANCE_TERMINATED,
           "terminated": INSTANCE_TERMINATED}


@dataclass(frozen=True)
class InterruptionEvent:
    kind: str
    instance_ids: tuple[str, ...]
    detail: Mapping[str, Any] = field(default_factory=dict)


def parse_event(body: str) -> InterruptionEvent | None:
    """The event a message body carries, or None for anything we do not act on (unparsable included)."""
    try:
        event = parse_json_text(body, "interruption message")   # bounded depth, through kubegpu.files
    except (TypeError, ValueError, ConfigError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        return None
    source, kind, detail = event.get("source"), event.get("detail-type"), event["detail"]
    instance = str(detail.get("instance-id") or "")
    if source == "aws.ec2" and kind == "EC2 Spot Instance Interruption Warning" and instance:
        return InterruptionEvent(SPOT_INTERRUPTED, (instance,), detail)
    if source == "aws.ec2" and kind == "EC2 Instance Rebalance Recommendation" and instance:
        return InterruptionEvent(REBALANCE, (instance,), detail)
    if source == "aws.ec2" and kind == "EC2 Instance State-change Notification" and instance:
        state = _STATES.get(str(detail.get("state") or ""))
        return InterruptionEvent(state, (instance,), detail) if state else None
    if source == "aws.ec2" and kind == "EC2 Capacity Reservation Instance Interruption Warning" and instance:
        return InterruptionEvent(RESERVATION_INTERRUPTED, (instance,), detail)
    if source == "aws.health" and kind == "AWS Health Event" and detail.get("service") == "EC2" \
            and detail.get("eventTypeCategory") == "scheduledChange":
        ids = tuple(str(e.get("entityValue")) for e in detail.get("affectedEntities") or []
                    if isinstance(e, dict) and str(e.get("entityValue", "")).startswith("i-"))
        return InterruptionEvent(SCHEDULED_CHANGE, ids, detail) if ids else None
    return None


def do_not_disrupt(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(annotations.get(key) == "true" for key in DO_NOT_DISRUPT)


class InterruptionHandler:
    """Polls the queue each pass and walks interrupted NodeClaims through cordon → replacement → drain → delete."""

    def __init__(self, provider: AwsProvider, queue_name: str, cluster: Cluster, provisioner: Provisioner,
                 termination: Termination, clock: Clock, log: Callable[[str], None] | None = None,
                 wait_seconds: int = 0) -> None:
        self.provider = provider
        self.queue_name = queue_name
        self.cluster = cluster
        self.provisioner = provisioner
        self.termination = termination
        self.clock = clock
        self.log = log or (lambda _line: None)
        self.wait_seconds = wait_seconds
        self._queue_url: str | None = None
        # NodeClaim name → reason; also written to the claim (INTERRUPTION_ANNOTATION), so a new leader resumes it
        self.draining: dict[str, str] = {}
        self.handled: list[tuple[str, str]] = []  # (event kind, NodeClaim name)

    @property
    def queue_url(self) -> str:
        if self._queue_url is None:
            self._queue_url = str(call(self.provider.clients.sqs, "get_queue_url",
                                       QueueName=self.queue_name)["QueueUrl"])
        return self._queue_url

    def reconcile(self, snapshot: Snapshot) -> None:
        sqs = self.provider.clients.sqs
        answer = call(sqs, "receive_message", QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                      WaitTimeSeconds=self.wait_seconds, VisibilityTimeout=20)
        for message in answer.get("Messages") or []:
            event = parse_event(message.get("Body") or "")
            try:
                if event is not None:
                    self.handle(event, snapshot)
            except KubegpuError as exc:   # left in the queue: redelivered after the visibility timeout
                self.log(f"interruption: {event.kind if event else '?'}: {exc}")
                continue
            call(sqs, "delete_message", QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        self._drain(snapshot)

    def _claims_for(self, instance_ids: tuple[str, ...], snapshot: Snapshot) -> list[dict[str, Any]]:
        wanted = set(instance_ids)
        out = []
        for claim in snapshot.nodeclaims:
            parsed = parse_provider_id((claim.get("status") or {}).get("providerID") or "")
            if parsed is not None and parsed[1] in wanted:
                out.append(claim)
        return out

    def handle(self, event: InterruptionEvent, snapshot: Snapshot) -> None:
        for claim in self._claims_for(event.instance_ids, snapshot):
            name = name_of(claim)
            labels = (claim.get("metadata") or {}).get("labels") or {}
            self.handled.append((event.kind, name))
            self.log(f"interruption: {event.kind} for nodeclaim {name}")
            if event.kind == SPOT_INTERRUPTED and labels.get(L.INSTANCE_TYPE_LABEL) and labels.get(L.ZONE_LABEL):
                self.provider.unavailable.mark(L.SPOT, labels[L.INSTANCE_TYPE_LABEL], labels[L.ZONE_LABEL])
            if name in self.draining or self.termination.is_terminating(name):
                if name in self.draining and event.kind == INSTANCE_TERMINATED:
                    self._mark(name, event.kind)   # the instance is gone: nothing is worth holding for
                continue
            node_name = (claim.get("status") or {}).get("nodeName")
            if node_name:
                taint_node(self.cluster, node_name, True)
            self._replace(claim, snapshot)
            if event.kind != REBALANCE:
                self._mark(name, event.kind)

    def _mark(self, name: str, reason: str) -> None:
        """Remember a drain in the API first (the claim's annotation), then in memory: what a failover must not lose
        lives where the next leader reads it."""
        self.cluster.patch("NodeClaim", name, {"metadata": {"annotations": {INTERRUPTION_ANNOTATION: reason}}})
        self.draining[name] = reason

    def _resume(self, snapshot: Snapshot) -> None:
        """Drains a previous leader started (annotated claims not terminating yet) join this one's."""
        for claim in snapshot.nodeclaims:
            reason = ((claim.get("metadata") or {}).get("annotations") or {}).get(INTERRUPTION_ANNOTATION)
            name = name_of(claim)
            if reason and name not in self.draining and not (claim.get("metadata") or {}).get("deletionTimestamp"):
                self.draining[name] = reason

    def _replace(self, claim: dict[str, Any], snapshot: Snapshot) -> None:
        """Pre-spin: schedule the node's pods as if it were gone and create the NodeClaims that takes."""
        node_name = (claim.get("status") or {}).get("nodeName")
        if not node_name:
            return
        pods = []
        for pod in snapshot.pods_on.get(node_name, []):
            if is_reschedulable(pod):
                spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
                pods.append({**pod, "spec": spec, "status": {"phase": "Pending"}})
        if not pods:
            return
        result = self.provisioner.schedule(snapshot, pods, exclude_nodes={node_name}, count_nominated=True)
        pools = {p.name: p for p in snapshot.pools}
        for plan in result.claims:
            created = self.provisioner.create_claim(plan, pools[plan.nodepool])
            self.log(f"interruption: pre-spun nodeclaim {name_of(created)} ({plan.instance_type}) for {node_name}")

    def _drain(self, snapshot: Snapshot) -> None:
        self._resume(snapshot)
        claims = {name_of(c): c for c in snapshot.nodeclaims}
        for name, reason in list(self.draining.items()):
            claim = claims.get(name)
            if claim is None:
                del self.draining[name]
                continue
            node_name = (claim.get("status") or {}).get("nodeName")
            on_node = [p for p in snapshot.pods if node_name and (p.get("spec") or {}).get("nodeName") == node_name
                       and not is_finished(p) and not is_daemon_pod(p)]
            held = [p for p in on_node if do_not_disrupt(p)]
            for pod in sorted((p for p in on_node if not do_not_disrupt(p)), key=name_of):
                namespace = (pod.get("metadata") or {}).get("namespace", "default")
                if evict(self.cluster, namespace, name_of(pod)) is not None:   # a budget says not now
                    held.append(pod)
            if not held or reason == INSTANCE_TERMINATED:
                self.termination.start(claim, "interrupted")
                del self.draining[name]

