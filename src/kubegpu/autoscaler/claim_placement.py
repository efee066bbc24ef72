"""How the provisioning pass places pods with DRA claims (a mixin of `scheduler.Scheduler`; the allocation itself
is `claims.DraPlanner`'s).

Such pods go one at a time, as kube-scheduler allocates: existing and in-flight nodes first (their CPU and memory, and
their devices: `DraPlanner.onto_node`), then the open NodeClaims, fewest pods first, keeping of each claim's candidate
instance types those the pod's claims fit on; then a new NodeClaim, sized by how many such pods a type's GPUs hold.
The methods read the scheduler's state through `_Host`, the part of `Scheduler` they use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from kubegpu.autoscaler.claims import DraPlanner, DraWorld, check_claims, implicit_claims, uses_claims
from kubegpu.autoscaler.pending import PendingPod, repels
from kubegpu.autoscaler.templates import EPS, OpenClaim, SchedulingResult, fit_counts
from kubegpu.scheduling import NodeInfo, fits

if TYPE_CHECKING:
    from collections.abc import Callable

    from kubegpu.autoscaler.instancetypes import InstanceType
    from kubegpu.autoscaler.requirements import Requirements
    from kubegpu.autoscaler.templates import NodeTemplate


class _Host(Protocol):
    """What the claim placement reads and calls on the scheduler."""

    existing: list[NodeInfo]
    claims: list[OpenClaim]
    index: dict[str, int]
    planner: DraPlanner | None
    _dra: DraWorld | Callable[[], DraWorld] | None
    _type_of: Callable[[str], InstanceType | None]

    def _world(self) -> DraPlanner | None: ...
    def _claims_onto_existing(self, item: PendingPod, result: SchedulingResult, need: int) -> bool: ...
    def _claims_onto(self, claim: OpenClaim, item: PendingPod, vec: np.ndarray, need: int = 1) -> bool: ...
    def _unschedulable(self, pods: list[PendingPod], result: SchedulingResult, why: str) -> None: ...
    def _fewest_pods_first(self, vec: np.ndarray) -> list[int]: ...
    def _open_claim(self, item: PendingPod, vec: np.ndarray, waiting: int) -> tuple[OpenClaim | None, str]: ...
    def _admits(self, tmpl: NodeTemplate, item: PendingPod) -> bool: ...
    def _merged(self, reqs: Requirements, item: PendingPod) -> Requirements | None: ...
    def _add_to_claim(self, claim: OpenClaim, pods: list[PendingPod], vec: np.ndarray,
                      pin: Requirements | None = None, only: np.ndarray | None = None) -> list[PendingPod]: ...


class ClaimPlacement:
    """The DRA part of the provisioning pass (module doc)."""

    planner: DraPlanner | None = None   # made on the first pod that needs it (`_world`)

    def _world(self: _Host) -> DraPlanner | None:
        if self.planner is None and self._dra is not None:
            world = self._dra if isinstance(self._dra, DraWorld) else self._dra()
            self.planner = DraPlanner(world, self._type_of)
        return self.planner

    def _claims_for(self: _Host, item: PendingPod) -> None:
        """The pod's DRA claims: its own, or the one kube-scheduler makes for extended resources no instance type
        offers but a DeviceClass serves (those leave the pod's requests)."""
        if self._dra is None:
            return
        if uses_claims(item.pod):
            planner = self._world()
            assert planner is not None
            item.claims = planner.world.pod_claims(item.pod)
            return
        missing = {k: v for k, v in item.requests.items() if k not in self.index and v > 0}
        if not missing:
            return
        planner = self._world()
        assert planner is not None
        if all(name in planner.world.extended for name in missing):
            planner.implicit.update(missing)
            item.claims = implicit_claims(planner.world, item.pod, missing)
            item.requests = {k: v for k, v in item.requests.items() if k not in missing}
    def _place_claims(self: _Host, group: list[PendingPod], result: SchedulingResult, vec: np.ndarray | None) -> None:
        """One pod at a time, as kube-scheduler allocates: existing nodes, then open claims (fewest pods first), then
        a new claim sized for the identical pods still waiting. The first pod of a claim others share goes only where
        all of them fit (they must follow it). Topology terms are not applied to such pods."""
        assert self.planner is not None
        for done, item in enumerate(group):
            assert item.claims is not None
            need = len(group) - done if self.planner.shares(item.claims) else 1
            why = check_claims(self.planner, item.claims)
            if why:
                self._unschedulable([item], result, why)
            elif self._claims_onto_existing(item, result, need):
                continue
            elif vec is None:
                missing = sorted(n for n, v in item.requests.items() if n not in self.index and v > 0)
                self._unschedulable([item], result, f"no instance type offers {', '.join(missing)}")
            elif not any(self._claims_onto(self.claims[i], item, vec, need) for i in self._fewest_pods_first(vec)):
                claim, why = self._open_claim(item, vec, len(group) - done)
                if claim is None:
                    self._unschedulable([item], result, why)
                elif not self._claims_onto(claim, item, vec, need) and not self._claims_onto(claim, item, vec):
                    self._unschedulable([item], result, f"nodepool {claim.template.pool.name}: no instance type "
                                        "satisfies every requirement for this pod")

    def _claims_onto_existing(self: _Host, item: PendingPod, result: SchedulingResult, need: int) -> bool:
        assert self.planner is not None and item.claims is not None
        for info in self.existing:
            if item.anti_key and any(repels(item, p) for p in info.pods):
                continue
            room = all(info.allocatable.get(k, 0.0) - info.requested.get(k, 0.0) >= v * need - EPS
                       for k, v in item.requests.items() if v > 0)
            if room and fits(item.pod, info, item.requests).ok and self.planner.onto_node(info, item.claims):
                info.add_pod(item.pod, item.requests)
                result.existing.setdefault(info.name, []).append(item.pod)
                return True
        return False

    def _claims_onto(self: _Host, claim: OpenClaim, item: PendingPod, vec: np.ndarray, need: int = 1) -> bool:
        """Add the pod to an open claim, keeping the candidate types its DRA claims fit on (with room for `need`
        pods like it) next to the claim's."""
        assert self.planner is not None and item.claims is not None
        if (item.anti_key and item.anti_key in claim.anti_keys) or not self._admits(claim.template, item) \
                or self._merged(claim.requirements, item) is None:
            return False
        allocations = self.planner.onto_claim(claim.index, claim.template.types, claim.cand, item.claims)
        if not allocations:
            return False
        only = np.zeros(len(claim.template.types), dtype=bool)
        only[list(allocations)] = True
        if need > 1:
            only &= fit_counts(claim.template.alloc, claim.used, vec) >= need
        if self._add_to_claim(claim, [item], vec, only=only):
            return False
        self.planner.commit_claim(claim.index, item.claims, allocations, claim.cand.tolist())
        return True
