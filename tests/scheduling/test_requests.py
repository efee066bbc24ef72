"""pod_requests against the Kubernetes resource-helper rules, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.scheduling import pod_requests


def container(
    requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": extra.pop("name", "c"), "resources": resources, **extra}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers, **spec}
    if init is not None:
        body["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": body}


CASES = [
    pytest.param(pod([]), {"pods": 1}, id="empty pod still takes a pod slot"),
    pytest.param(pod([container({"cpu": "500m", "memory": "1Gi"})]), {"cpu": 0.5, "memory": 2**30, "pods": 1},
                 id="plain requests"),
    pytest.param(pod([container(limits={"nvidia.com/gpu": 2})]), {"nvidia.com/gpu": 2, "pods": 1},
                 id="gpu limit implies request"),
    pytest.param(pod([container(limits={"nvidia.com/mig-1g.10gb": "1"})]), {"nvidia.com/mig-1g.10gb": 1, "pods": 1},
                 id="mig limit implies request"),
    pytest.param(pod([container(limits={"nvidia.com/gpu.shared": 1})]), {"nvidia.com/gpu.shared": 1, "pods": 1},
                 id="shared gpu limit implies request"),
    pytest.param(pod([container(limits={"nvidia.com/gpu-10gb": 1})]), {"nvidia.com/gpu-10gb": 1, "pods": 1},
                 id="mps memory slice limit implies request"),
    pytest.param(pod([container({"nvidia.com/gpu": 1})]), {"nvidia.com/gpu": 1, "pods": 1},
                 id="extended request without limit taken as given"),
    pytest.param(pod([container({"cpu": "1"}, {"cpu": "2", "memory": "4Gi"})]),
                 {"cpu": 1, "memory": 4 * 2**30, "pods": 1}, id="limit fills only the missing request"),
    pytest.param(pod([container({"cpu": "1"}), container({"cpu": "250m", "nvidia.com/gpu": 1})]),
                 {"cpu": 1.25, "nvidia.com/gpu": 1, "pods": 1}, id="app containers add up"),
    pytest.param(pod([container({"cpu": "1"})], init=[container({"cpu": "3", "memory": "1Gi"})]),
                 {"cpu": 3, "memory": 2**30, "pods": 1}, id="init container larger than app sum wins"),
    pytest.param(pod([container({"cpu": "2"}), container({"cpu": "2"})], init=[container({"cpu": "3"})]),
                 {"cpu": 4, "pods": 1}, id="app sum larger than init wins"),
    pytest.param(pod([container({"cpu": "1"})], init=[container({"cpu": "2"}), container({"cpu": "3"})]),
                 {"cpu": 3, "pods": 1}, id="init containers take the max not the sum"),
    pytest.param(pod([container(limits={"nvidia.com/gpu": 1})], init=[container(limits={"nvidia.com/gpu": 4})]),
                 {"nvidia.com/gpu": 4, "pods": 1}, id="init container gpu limit counts"),
    pytest.param(pod([container({"cpu": "1"})], init=[container({"cpu": "500m"}, restartPolicy="Always"),
                                                      container({"cpu": "2"})]),
                 {"cpu": 2.5, "pods": 1}, id="sidecar stays counted during later init steps"),
    pytest.param(pod([container({"cpu": "1"})], init=[container({"cpu": "500m"}, restartPolicy="Always")]),
                 {"cpu": 1.5, "pods": 1}, id="sidecar adds to the app sum"),
    pytest.param(pod([container({"cpu": "1"})], overhead={"cpu": "250m", "memory": "120Mi"}),
                 {"cpu": 1.25, "memory": 120 * 2**20, "pods": 1}, id="pod overhead is added"),
    pytest.param(pod([container({"cpu": "0", "nvidia.com/gpu": 0})]), {"pods": 1}, id="zero requests dropped"),
]


@pytest.mark.parametrize(("the_pod", "expected"), CASES)
def test_pod_requests(the_pod: dict[str, Any], expected: dict[str, float]) -> None:
    assert pod_requests(the_pod) == pytest.approx(expected)


def test_bad_quantity_names_the_pod_and_field() -> None:
    bad = pod([container({"cpu": "1"}), container(limits={"nvidia.com/gpu": "two"})])
    with pytest.raises(ConfigError, match=r"pod ns/p: spec.containers\[1\].resources.limits.nvidia.com/gpu"):
        pod_requests(bad)
