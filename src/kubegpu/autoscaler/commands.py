"""Carrying out disruption's commands (Karpenter's orchestration queue), recorded in the API before they act.

A command is written onto its candidates' NodeClaims — the `kubegpu.io/disruption` annotation names the reason, every
candidate and the replacements, whose names are chosen before they are created — before any candidate is tainted,
and the replacements are created only once every candidate is tainted (`recovery.py` for the whole scheme). Each
pass reads the commands back from the API and walks them on (`Orchestrator.progress`), so whatever write a leader
died after, the next one finishes or undoes the command: a deletion whose candidate was tainted goes on to
termination, one whose taint never landed is dropped (the decision is taken again, validated anew); a replacement
that was never created, or that does not initialize within `replacement_timeout`, is rolled back (deleted,
candidates untainted).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler import labels as L
from kubegpu.autoscaler.objects import has_taint, is_true, name_of
from kubegpu.autoscaler.recovery import DISRUPTION, fresh, set_disrupted
from kubegpu.kube import NotFound

if TYPE_CHECKING:
    from kubegpu.autoscaler.cluster_state import Snapshot
    from kubegpu.autoscaler.provisioner import Provisioner
    from kubegpu.autoscaler.scheduler import ClaimPlan
    from kubegpu.autoscaler.termination import Termination
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster

DISRUPTION_ANNOTATION = L.DISRUPTION_ANNOTATION


@dataclass
class Command:
    reason: str                       # Empty | Underutilized | Drifted
    candidates: list[Any]             # disruption.Candidate
    replacements: list[ClaimPlan] = field(default_factory=list)
    decided_at: float = 0.0
    replacement_names: list[str] = field(default_factory=list)
    launched_at: float = 0.0

    def describe(self) -> str:
        names = ", ".join(c.name for c in self.candidates)
        if not self.replacements:
            return f"delete {names} ({self.reason})"
        types = ", ".join(p.instance_type for p in self.replacements)
        price = sum(p.price for p in self.replacements)
        return f"replace {names} with {types} at {price:.4f}/h ({self.reason})"


@dataclass
class InFlight:
    """A command under way, as read back from the API: the candidates' `kubegpu.io/disruption` annotation names the
    reason, the candidates and the replacement NodeClaims, so a replica that becomes leader finishes (or rolls back)
    what another began. `claims`: the live candidates that carry the record."""

    reason: str
    claims: list[dict[str, Any]]
    replacement_names: list[str]
    launched_at: float

    def describe(self) -> str:
        names = ", ".join(name_of(c) for c in self.claims)
        if not self.replacement_names:
            return f"delete {names} ({self.reason})"
        return f"replace {names} with {', '.join(self.replacement_names)} ({self.reason})"


def replacement_name(pool: str, candidates: Sequence[str], at: float, index: int) -> str:
    """The name a replacement gets, fixed before it is created so that the record can name it first."""
    digest = hashlib.sha1(json.dumps([sorted(candidates), repr(at), index]).encode()).hexdigest()[:10]
    return f"{pool}-{digest}"


def in_flight_commands(nodeclaims: Sequence[dict[str, Any]]) -> list[InFlight]:
    """The commands under way, grouped by the annotation the candidates share."""
    groups: dict[str, InFlight] = {}
    for claim in nodeclaims:
        meta = claim.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(DISRUPTION_ANNOTATION)
        if not raw or meta.get("deletionTimestamp"):
            continue
        try:
            data = json.loads(raw)
            entry = groups.get(raw) or InFlight(str(data["reason"]), [], [str(n) for n in data["replacements"]],
                                                float(data["launchedAt"]))
        except (ValueError, KeyError, TypeError):
            continue  # not ours to read: left alone
        groups[raw] = entry
        entry.claims.append(claim)
    return list(groups.values())


class Orchestrator:
    """Executes commands and walks the recorded ones on, every pass (module doc)."""

    def __init__(self, cluster: Cluster, provisioner: Provisioner, termination: Termination, clock: Clock,
                 replacement_timeout: float, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.provisioner = provisioner
        self.termination = termination
        self.clock = clock
        self.replacement_timeout = replacement_timeout
        self.log = log
        self.in_flight: list[InFlight] = []   # read back from the API every pass (see `InFlight`)
        self.executed: list[Command] = []

    def execute(self, command: Command, snapshot: Snapshot) -> None:
        """Record, taint, then act (module doc): each step is written before the next one starts."""
        self.log(f"disruption: {command.describe()}")
        self.executed.append(command)
        command.launched_at = self.clock.now()
        names = [c.name for c in command.candidates]
        command.replacement_names = [replacement_name(plan.nodepool, names, command.launched_at, i)
                                     for i, plan in enumerate(command.replacements)]
        note = json.dumps({"reason": command.reason, "candidates": names,
                           "replacements": command.replacement_names, "launchedAt": command.launched_at},
                          sort_keys=True)
        for cand in command.candidates:   # the command lives in the API from here on
            self.cluster.patch("NodeClaim", cand.name, {"metadata": {"annotations": {DISRUPTION_ANNOTATION: note}}})
        for cand in command.candidates:
            set_disrupted(self.cluster, name_of(cand.node), True, DISRUPTION)
        if not command.replacements:
            for cand in command.candidates:
                self.termination.start(cand.claim, command.reason.lower())
            return
        pools = {p.name: p for p in snapshot.pools}
        for plan, name in zip(command.replacements, command.replacement_names, strict=True):
            self.provisioner.create_claim(plan, pools[plan.nodepool], name=name)
        self.in_flight.append(InFlight(command.reason, [c.claim for c in command.candidates],
                                       command.replacement_names, command.launched_at))

    def progress(self, snapshot: Snapshot, now: float) -> None:
        """Walk every command recorded in the API one step on (whoever recorded it)."""
        claims = {name_of(c): c for c in snapshot.nodeclaims}
        self.in_flight = in_flight_commands(snapshot.nodeclaims)
        for command in list(self.in_flight):
            if not command.replacement_names:
                self._finish_deletion(command, snapshot)
                self.in_flight.remove(command)
                continue
            replacements = [claims.get(n) for n in command.replacement_names]
            if all(r is not None and is_true(r, "Initialized") for r in replacements):
                for claim in command.claims:
                    self.termination.start(claim, command.reason.lower())
                self.in_flight.remove(command)
            elif now >= command.launched_at + self.replacement_timeout or any(
                    r is None or self.termination.is_terminating(r) for r in replacements):
                self.log(f"disruption: rolling back {command.describe()}: replacement not initialized")
                self._undo(command.claims)
                for r in replacements:
                    if r is not None:
                        self.termination.start(r, "rollback")
                self.in_flight.remove(command)

    def _finish_deletion(self, command: InFlight, snapshot: Snapshot) -> None:
        """A recorded deletion a leader did not finish: candidates whose taint landed go to termination; for the
        others the act never began, so their record is dropped (the decision is taken again, validated anew)."""
        untainted = []
        for claim in command.claims:
            node_name = (claim.get("status") or {}).get("nodeName") or ""
            if node_name and not self._tainted(node_name, snapshot):
                untainted.append(claim)
            else:
                self.log(f"disruption: finishing {command.describe()}")
                self.termination.start(claim, command.reason.lower())
        if untainted:
            self.log(f"disruption: dropping {command.describe()}: its taint never landed")
            self._undo(untainted)

    def _tainted(self, node_name: str, snapshot: Snapshot) -> bool:
        node = snapshot.nodes.get(node_name)
        if node is not None and has_taint(node, L.DISRUPTED_TAINT):
            return True
        try:   # the cache may not show the taint yet (Nodes and NodeClaims are watched apart): ask the server
            return has_taint(fresh(self.cluster).get("Node", node_name), L.DISRUPTED_TAINT)
        except NotFound:
            return True   # no node left to keep: termination takes the claim from here

    def _undo(self, claims: Sequence[dict[str, Any]]) -> None:
        """Untaint the candidates, then drop their record (the record goes last: until then it explains the taint)."""
        for claim in claims:
            node_name = (claim.get("status") or {}).get("nodeName")
            if node_name:
                set_disrupted(self.cluster, node_name, False, DISRUPTION)
            with contextlib.suppress(NotFound):
                self.cluster.patch("NodeClaim", name_of(claim),
                                   {"metadata": {"annotations": {DISRUPTION_ANNOTATION: None}}})
