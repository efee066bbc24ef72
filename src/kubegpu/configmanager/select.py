"""Which config a node runs: the label's value, else the default, else the fallbacks. Pure: names in, name out.

The rules are NVIDIA config-manager's, so a GPU Operator user's ConfigMaps and labels mean the same here:

- the label names a key → that key, which must exist (a typo is an error naming the label, never a silent default);
- no label (or an empty value) → `default`, which must exist when set;
- no default → the fallback strategies in order: `named` (a key called `default`), `single` (the only key), `empty`
  (no file: the operand's built-in defaults).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubegpu.errors import ConfigError

DEFAULT_LABEL = "nvidia.com/device-plugin.config"
FALLBACK_NAMED = "named"
FALLBACK_SINGLE = "single"
FALLBACK_EMPTY = "empty"
FALLBACKS = (FALLBACK_NAMED, FALLBACK_SINGLE, FALLBACK_EMPTY)
NAMED_FALLBACK_CONFIG = "default"
EMPTY = ""
"""The selection meaning "no config file": the operand runs on its defaults (and its flags and env)."""


@dataclass(frozen=True)
class Selection:
    name: str  # a key of the ConfigMap, or EMPTY
    why: str  # one phrase for the log: "label nvidia.com/device-plugin.config=ts", "default ts", ...


def available_configs(entries: Iterable[str]) -> list[str]:
    """The config names in a mounted ConfigMap directory listing: Kubernetes' own `..data` / `..2026_...` entries
    (the atomic-update machinery of a ConfigMap volume) are not configs."""
    return sorted(name for name in entries if name and not name.startswith(".."))


def parse_fallbacks(text: str | Sequence[str]) -> tuple[str, ...]:
    """`named,single` (the env var's form) or a list; an unknown strategy is an error naming it."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = tuple(item.strip() for item in items if item.strip())
    for item in out:
        if item not in FALLBACKS:
            raise ConfigError(f"--fallback-strategies: unknown strategy {item!r} (want {', '.join(FALLBACKS)})")
    return out


def select_config(value: str | None, available: Sequence[str], default: str = "",
                  fallbacks: Sequence[str] = (), label: str = DEFAULT_LABEL) -> Selection:
    """The config for a node whose label `label` has `value` (None: no such label)."""
    names = ", ".join(available) or "none"
    if value:
        if value not in available:
            raise ConfigError(f"node label {label}={value}: no such config (available: {names})")
        return Selection(value, f"label {label}={value}")
    if default:
        if default not in available:
            raise ConfigError(f"default config {default!r}: no such config (available: {names})")
        return Selection(default, f"no {label} label; default {default}")
    for strategy in fallbacks:
        if strategy == FALLBACK_NAMED and NAMED_FALLBACK_CONFIG in available:
            return Selection(NAMED_FALLBACK_CONFIG, f"no {label} label or default; the config named 'default'")
        if strategy == FALLBACK_SINGLE and len(available) == 1:
            return Selection(available[0], f"no {label} label or default; the only config")
        if strategy == FALLBACK_EMPTY:
            return Selection(EMPTY, f"no {label} label or default; no config file")
    tried = ", ".join(fallbacks) or "none"
    raise ConfigError(f"no {label} label, no default config, and no fallback applies (fallbacks: {tried}; "
                      f"available: {names})")
