"""EC2NodeClass status conditions as Karpenter gives them, and the reason a pod hears when its class is not ready.

Karpenter's AWS provider reports on each EC2NodeClass `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`,
`InstanceProfileReady` (and `CapacityReservationsReady`, `ValidationSucceeded`), each a Kubernetes condition
(type, status, reason, message, lastTransitionTime, observedGeneration), plus the root `Ready`: True (reason `Ready`)
when every dependent is True, else False with reason `UnhealthyDependents`. The reasons are Karpenter's
(`SubnetsNotFound`, `SecurityGroupsNotFound`, `AMINotFound`, `InstanceProfileNotFound`); the messages go further than
its "SubnetSelector did not match any Subnets" and quote the selector terms that matched nothing, so the user sees
which selector to fix. A NodePool whose class is not Ready launches nothing, and every pod that only it could have
served is told why (`pool_reason`) instead of an instance-type reason that does not apply.

Pure: the lookups (Describe calls, IAM) are `resolve.py`'s; this module only turns their results into conditions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel

from kubegpu.autoscaler.aws.nodeclass import Condition, EC2NodeClass, EC2NodeClassStatus

READY = "Ready"
SUBNETS_READY = "SubnetsReady"
SECURITY_GROUPS_READY = "SecurityGroupsReady"
AMIS_READY = "AMIsReady"
INSTANCE_PROFILE_READY = "InstanceProfileReady"
CAPACITY_RESERVATIONS_READY = "CapacityReservationsReady"
VALIDATION_SUCCEEDED = "ValidationSucceeded"
DEPENDENTS = (AMIS_READY, SUBNETS_READY, SECURITY_GROUPS_READY, INSTANCE_PROFILE_READY, CAPACITY_RESERVATIONS_READY,
              VALIDATION_SUCCEEDED)


def terms_text(terms: Sequence[BaseModel]) -> str:
    """Selector terms as the user wrote them, compact: `[{"tags": {"team": "ml"}}]`."""
    return json.dumps([t.model_dump(mode="json", exclude_none=True) for t in terms], sort_keys=True)


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dependents(nodeclass: EC2NodeClass, status: EC2NodeClassStatus,
                profile_problem: str | None) -> list[tuple[str, bool, str, str]]:
    """(type, ok, reason when not ok, message when not ok) for each dependent condition."""
    spec = nodeclass.spec
    return [
        (AMIS_READY, bool(status.amis), "AMINotFound",
         f"amiSelectorTerms {terms_text(spec.amiSelectorTerms)} matched no AMI"),
        (SUBNETS_READY, bool(status.subnets), "SubnetsNotFound",
         f"subnetSelectorTerms {terms_text(spec.subnetSelectorTerms)} matched no subnet"),
        (SECURITY_GROUPS_READY, bool(status.securityGroups), "SecurityGroupsNotFound",
         f"securityGroupSelectorTerms {terms_text(spec.securityGroupSelectorTerms)} matched no security group"),
        (INSTANCE_PROFILE_READY, profile_problem is None, "InstanceProfileNotFound", profile_problem or ""),
        (CAPACITY_RESERVATIONS_READY, True, "", ""),
        (VALIDATION_SUCCEEDED, True, "", ""),
    ]


def compute(nodeclass: EC2NodeClass, status: EC2NodeClassStatus, *, profile_problem: str | None = None,
            now: datetime | None = None) -> list[Condition]:
    """The class's conditions for the status its selectors resolved to: `Ready` first, then its dependents.

    `lastTransitionTime` moves only when a condition's status changes (it is carried over from the class's current
    conditions otherwise), as Kubernetes conditions are meant to; `observedGeneration` is the spec generation the
    conditions were computed for.
    """
    moment = timestamp(now or datetime.now(UTC))
    previous = {c.type: c for c in nodeclass.status.conditions}
    generation = _generation(nodeclass)

    def condition(kind: str, ok: bool, reason: str, message: str) -> Condition:
        state: Literal["True", "False"] = "True" if ok else "False"
        before = previous.get(kind)
        since = before.lastTransitionTime if before is not None and before.status == state \
            and before.lastTransitionTime else moment
        return Condition(type=kind, status=state, reason=kind if ok else reason, message="" if ok else message,
                         lastTransitionTime=since, observedGeneration=generation)

    dependents = [condition(*row) for row in _dependents(nodeclass, status, profile_problem)]
    failing = [c for c in dependents if c.status != "True"]
    root = condition(READY, not failing, "UnhealthyDependents",
                     "; ".join(f"{c.type}=False: {c.message}" for c in failing))
    return [root, *dependents]


def _generation(nodeclass: EC2NodeClass) -> int | None:
    value: Any = (nodeclass.metadata.model_extra or {}).get("generation")
    return int(value) if isinstance(value, int) else None


def not_ready(status: EC2NodeClassStatus) -> str | None:
    """Why the class cannot launch — its `Ready` condition's message — or None when it is Ready."""
    for cond in status.conditions:
        if cond.type == READY:
            return None if cond.status == "True" else (cond.message or cond.reason or "not ready")
    return "not resolved yet"


def pool_reason(pool: str, nodeclass: str, why: str) -> str:
    """What a pod that only this NodePool could serve is told (Karpenter's NodeClassReady=False, in one line)."""
    return f"nodepool {pool}: EC2NodeClass {nodeclass} is not ready: {why}"
