"""What a pod asks of a node, computed the way the API server and kube-scheduler do.

Rules (Kubernetes' resource helpers, which the scheduler's NodeResourcesFit uses):
- a container's limit stands in for a missing request of the same resource (the API server defaults requests from
  limits; for extended resources such as ``nvidia.com/gpu`` only limits are usually written);
- app containers add up; restartable init containers (sidecars, ``restartPolicy: Always``) add to the app sum and
  stay counted while later init containers run; the pod needs the larger of that sum and the largest init step;
- the pod's ``spec.overhead`` (RuntimeClass) is added on top;
- every pod takes one of the node's ``pods`` slots.
Zero amounts are dropped (a zero request never blocks a fit), so the dict only names what matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubegpu.errors import ConfigError
from kubegpu.scheduling.quantity import parse_quantity


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Resource name → amount the pod needs on a node, always including ``"pods": 1``."""
    spec = pod.get("spec") or {}
    where = _pod_label(pod)
    total: dict[str, float] = {}
    for index, container in enumerate(spec.get("containers") or ()):
        _add(total, container_requests(container, f"{where}: spec.containers[{index}]"))
    sidecars: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for index, container in enumerate(spec.get("initContainers") or ()):
        own = container_requests(container, f"{where}: spec.initContainers[{index}]")
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            step = dict(sidecars)
        else:
            step = dict(own)
            _add(step, sidecars)
        _max(init_peak, step)
    _max(total, init_peak)
    _add(total, _quantities(spec.get("overhead") or {}, f"{where}: spec.overhead"))
    requests = {name: amount for name, amount in total.items() if amount != 0.0}
    requests["pods"] = 1.0
    return requests


def container_requests(container: Mapping[str, Any], where: str = "container") -> dict[str, float]:
    """One container's requests, with limits standing in for missing requests."""
    resources = container.get("resources") or {}
    requests = _quantities(resources.get("requests") or {}, f"{where}.resources.requests")
    for name, amount in _quantities(resources.get("limits") or {}, f"{where}.resources.limits").items():
        requests.setdefault(name, amount)
    return requests


def _quantities(values: Mapping[str, Any], where: str) -> dict[str, float]:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of resource name to quantity, got {type(values).__name__}")
    parsed: dict[str, float] = {}
    for name, raw in values.items():
        try:
            parsed[name] = parse_quantity(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{name}: {exc}") from None
    return parsed


def _add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0.0) + amount


def _max(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for name, amount in amounts.items():
        if amount > into.get(name, 0.0):
            into[name] = amount


def _pod_label(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    namespace = metadata.get("namespace")
    return f"pod {namespace}/{name}" if namespace else f"pod {name}"
