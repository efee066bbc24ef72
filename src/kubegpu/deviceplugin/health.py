"""Device health from XID events, with recovery.

NVIDIA's rules decide which XIDs count (ignore 13, 31, 43, 45, 68, 109 unless `DP_ENABLE_HEALTHCHECKS` forces
them; `DP_DISABLE_HEALTHCHECKS` = all | xids | extra list to ignore). Two fixes over NVIDIA: a critical XID marks
the whole physical GPU, so every replica and MIG device on it goes Unhealthy (NVIDIA marks one, #1929), and a GPU
recovers once no critical XID has arrived for a quiet period and a probe of the GPU succeeds (NVIDIA never does).
Pure: events and the current time come in, decisions go out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_QUIET_PERIOD_S = 300.0


@dataclass(frozen=True)
class HealthPolicy:
    """Which XIDs make a GPU unhealthy, and how long it must stay quiet before it may recover."""

    enabled: bool = True
    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
    forced: frozenset[int] = frozenset()
    force_all: bool = False
    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S

    def is_critical(self, xid: int) -> bool:
        if not self.enabled:
            return False
        if self.force_all or xid in self.forced:
            return True
        return xid not in self.ignored


def _xid_list(value: str, warnings: list[str], variable: str) -> set[int]:
    xids = set()
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if item.isdigit():
            xids.add(int(item))
        else:
            warnings.append(f"{variable}: ignoring malformed XID {item!r}")
    return xids


def policy_from_env(env: Mapping[str, str], quiet_period_s: float = DEFAULT_QUIET_PERIOD_S) -> tuple[
    HealthPolicy, list[str]
]:
    """NVIDIA's `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS`; malformed entries are skipped with a warning."""
    warnings: list[str] = []
    disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    enable = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
    force_all = enable == "all"
    forced = frozenset() if force_all else frozenset(_xid_list(enable, warnings, "DP_ENABLE_HEALTHCHECKS"))
    if disable in ("all", "xids") and not (force_all or forced):
        return HealthPolicy(enabled=False, quiet_period_s=quiet_period_s), warnings
    extra = set() if disable in ("all", "xids") else _xid_list(disable, warnings, "DP_DISABLE_HEALTHCHECKS")
    policy = HealthPolicy(
        enabled=True,
        ignored=DEFAULT_IGNORED_XIDS | frozenset(extra),
        forced=forced,
        force_all=force_all,
        quiet_period_s=quiet_period_s,
    )
    return policy, warnings


@dataclass
class HealthTracker:
    """Which physical GPUs are unhealthy, and since the last critical XID when."""

    policy: HealthPolicy
    last_critical: dict[int, float] = field(default_factory=dict)  # gpu index → time of its last critical XID
    last_xid: dict[int, int] = field(default_factory=dict)

    @property
    def unhealthy(self) -> frozenset[int]:
        return frozenset(self.last_critical)

    def observe(self, events: Iterable[Any], now: float) -> set[int]:
        """Record XID events (anything with `gpu_index` and `xid`); return GPUs that just became unhealthy."""
        newly = set()
        for event in events:
            if not self.policy.is_critical(int(event.xid)):
                continue
            if event.gpu_index not in self.last_critical:
                newly.add(int(event.gpu_index))
            self.last_critical[int(event.gpu_index)] = now
            self.last_xid[int(event.gpu_index)] = int(event.xid)
        return newly

    def recover(self, now: float, probe: Callable[[int], bool]) -> set[int]:
        """GPUs quiet for the whole quiet period whose probe succeeds become healthy again."""
        recovered = {
            index
            for index, since in self.last_critical.items()
            if now - since >= self.policy.quiet_period_s and probe(index)
        }
        for index in recovered:
            del self.last_critical[index]
            self.last_xid.pop(index, None)
        return recovered
