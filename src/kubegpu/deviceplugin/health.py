"""Device health from XID events, with recovery.

NVIDIA's rules decide which XIDs count (ignore 13, 31, 43, 45, 68, 109 unless `DP_ENABLE_HEALTHCHECKS` forces
them; `DP_DISABLE_HEALTHCHECKS` = all | xids | extra list to ignore). Two fixes over NVIDIA: a critical XID marks
the whole physical GPU, so every replica and MIG device on it goes Unhealthy (NVIDIA marks one, #1929), and a GPU
recovers once no critical XID has arrived for a quiet period and a probe of the GPU succeeds (NVIDIA never does).
The pure tracker (`HealthPolicy`, `HealthTracker`) lives in `kubegpu.gpu.xid`, shared with the discovery agent's
node condition; this module adds NVIDIA's environment variables. Pure: events and the time in, decisions out.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubegpu.gpu.xid import APPLICATION_XIDS as DEFAULT_IGNORED_XIDS
from kubegpu.gpu.xid import DEFAULT_QUIET_PERIOD_S, HealthPolicy, HealthTracker

__all__ = ["DEFAULT_IGNORED_XIDS", "DEFAULT_QUIET_PERIOD_S", "HealthPolicy", "HealthTracker", "policy_from_env"]


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
