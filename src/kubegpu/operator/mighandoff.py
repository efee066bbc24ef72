"""The operator's half of the MIG hand-off: no node stays in `paused-for-mig-change`.

The MIG manager (kubegpu.migmanager) sets `nvidia.com/mig.config.state=pending`, pauses the GPU clients' deploy
labels, applies the layout and restores them in a `finally`. The wedge users of the GPU Operator hit (#2833) is
what happens when that agent dies or hangs mid-change. The operator therefore watches every node and:

- labels paused while no change is running (state success/failed/absent: the agent crashed after or between
  changes) → restored to `true` at once;
- a change running (pending/rebooting) → the time it was first seen is recorded on the Node (an annotation, so an
  operator restart resumes the same clock); past `migManager.timeoutSeconds` the labels are restored and the state
  set to `failed`, so the node serves its GPUs again and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubegpu.operator.components import DEPLOY_LABEL_PREFIX

PAUSED = "paused-for-mig-change"
STATE_LABEL = "nvidia.com/mig.config.state"
SINCE_ANNOTATION = "kubegpu.io/mig-change-since"
RUNNING = ("pending", "rebooting")


@dataclass
class Heal:
    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    reason: str = ""

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations


def paused_labels(labels: dict[str, str]) -> list[str]:
    return sorted(k for k, v in labels.items() if k.startswith(DEPLOY_LABEL_PREFIX) and v == PAUSED)


def heal(labels: dict[str, str], annotations: dict[str, str], now: float, timeout: float) -> Heal:
    """The label and annotation patch that keeps this node out of a MIG wedge (empty when all is well)."""
    paused = paused_labels(labels)
    state = labels.get(STATE_LABEL, "")
    since_text = annotations.get(SINCE_ANNOTATION)
    if state in RUNNING:
        if since_text is None:
            return Heal({}, {SINCE_ANNOTATION: f"{now:.3f}"}, "")
        try:
            since = float(since_text)
        except ValueError:
            return Heal({}, {SINCE_ANNOTATION: f"{now:.3f}"}, "")
        if now - since < timeout:
            return Heal({}, {})
        patch: dict[str, str | None] = {key: "true" for key in paused}
        patch[STATE_LABEL] = "failed"
        return Heal(patch, {SINCE_ANNOTATION: None},
                    f"MIG change still {state} after {timeout:.0f}s: GPU clients restored, state failed")
    heal_patch = Heal({key: "true" for key in paused}, {SINCE_ANNOTATION: None} if since_text is not None else {})
    if paused:
        heal_patch.reason = f"GPU clients left {PAUSED} with no MIG change running ({state or 'no state'}): restored"
    return heal_patch
