"""Per-node device-plugin configs and the MPS control daemon, as the operator renders them (GPU Operator shape:
`devicePlugin.config{name,default}`, the `nvidia.com/device-plugin.config` label, `state-mps-control-daemon` on
nodes labelled `nvidia.com/mps.capable=true`)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.errors import ConfigError
from kubegpu.operator.components import STATES
from kubegpu.operator.nodelabels import node_label_change
from kubegpu.operator.policy import parse_policy
from kubegpu.operator.render import render


def policy(spec: dict[str, Any]) -> Any:
    return parse_policy({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
                         "spec": spec})


def workloads(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for _, objs in render(policy(spec)) for o in objs
            if o["kind"] in ("DaemonSet", "Deployment")}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", []) if "value" in e}


CONFIGURED = {"devicePlugin": {"config": {"name": "dp-configs", "default": "whole"}, "mps": {"root": "/run/kg/mps"}}}


def test_config_manager_init_and_sidecar_follow_the_node_label() -> None:
    for name in ("kubegpu-device-plugin", "kubegpu-gpu-feature-discovery", "kubegpu-mps-control-daemon"):
        pod = workloads(CONFIGURED)[name]["spec"]["template"]["spec"]
        operand, sidecar = pod["containers"]
        init = pod["initContainers"][-1]
        assert pod["initContainers"][0]["name"] == "wait-toolkit-ready"  # the config is chosen after the barrier
        assert (init["name"], sidecar["name"]) == ("config-manager-init", "config-manager")
        for container, oneshot in ((init, "true"), (sidecar, "false")):
            assert container["command"] == ["kubegpu", "config-manager"]
            assert env(container) == {"ONESHOT": oneshot, "NODE_LABEL": "nvidia.com/device-plugin.config",
                                      "CONFIG_FILE_SRCDIR": "/available-configs",
                                      "CONFIG_FILE_DST": "/config/config.yaml", "DEFAULT_CONFIG": "whole",
                                      "FALLBACK_STRATEGIES": "named,single,empty"}
            assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in \
                container["env"]
        assert "--config-file=/config/config.yaml" in operand["args"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["available-configs"]["configMap"] == {"name": "dp-configs"}
        assert volumes["config"] == {"name": "config", "emptyDir": {}}
        # the operand resolves the link: it sees the ConfigMap at the same path the config-manager does
        mounts = {m["name"]: m["mountPath"] for m in operand["volumeMounts"]}
        assert mounts["available-configs"] == "/available-configs" and mounts["config"] == "/config"
        assert "shareProcessNamespace" not in pod  # no signal: the operands watch the file


def test_the_config_managers_can_watch_their_node() -> None:
    rendered = {o["metadata"]["name"]: o for _, objs in render(policy(CONFIGURED)) for o in objs
                if o["kind"] == "ClusterRole"}
    for name in ("kubegpu-device-plugin", "kubegpu-gpu-feature-discovery", "kubegpu-mps-control-daemon"):
        rules = rendered[name]["rules"]
        assert any(r["resources"] == ["nodes"] and {"get", "list", "watch"} <= set(r["verbs"]) for r in rules)


def test_without_a_config_name_nothing_is_selected_per_node() -> None:
    pod = workloads({})["kubegpu-device-plugin"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["device-plugin"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait-toolkit-ready"]
    assert not any(a.startswith("--config-file") for a in pod["containers"][0]["args"])


def test_mps_daemon_follows_the_device_plugin_on_mps_capable_nodes() -> None:
    assert STATES.index("state-mps-control-daemon") == STATES.index("state-device-plugin") + 1
    daemon = workloads(CONFIGURED)["kubegpu-mps-control-daemon"]
    pod = daemon["spec"]["template"]["spec"]
    assert daemon["metadata"]["labels"]["kubegpu.io/state"] == "state-mps-control-daemon"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/mps.capable": "true"}
    assert daemon["spec"]["template"]["metadata"]["labels"]["app"] == "nvidia-device-plugin-mps-control-daemon"
    assert pod["hostPID"] is True
    container = pod["containers"][0]
    assert container["command"] == ["kubegpu", "mps-control-daemon"] and container["securityContext"]["privileged"]
    assert env(container)["MPS_ROOT"] == "/run/kg/mps"
    for reader in ("kubegpu-device-plugin", "kubegpu-gpu-feature-discovery"):  # an MPS config needs its root
        assert env(workloads(CONFIGURED)[reader]["spec"]["template"]["spec"]["containers"][0])[
            "MPS_ROOT"] == "/run/kg/mps"  # the plugin mounts the same host paths into MPS pods
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["mps-root"] == mounts["mps-root"] == "/run/kg/mps"
    assert (volumes["mps-shm"], mounts["mps-shm"]) == ("/run/kg/mps/shm", "/dev/shm")
    # the device plugin's switch turns both off
    off = workloads({"devicePlugin": {"enabled": False}})
    assert "kubegpu-device-plugin" not in off and "kubegpu-mps-control-daemon" not in off


def test_the_mps_daemon_adds_no_deploy_label_of_its_own() -> None:
    change = node_label_change(policy({}), {"nvidia.com/gpu.present": "true"})
    assert "nvidia.com/gpu.deploy.device-plugin" in change.set
    assert not any("mps" in key for key in change.set)


def test_a_simulated_gpu_backend_reaches_every_node_agent() -> None:
    """`gpuBackend: sim:PATH` (a cluster without GPUs): each `--gpu-backend` says so, and PATH's directory (node
    file, lock, stand-in devices) is mounted at the same path wherever it is read."""
    spec = {"gpuBackend": "sim:/var/lib/kubegpu-sim/node.json", "partitioner": {"enabled": True},
            "draDriver": {"enabled": True}, **CONFIGURED}
    checked = 0
    for name, obj in workloads(spec).items():
        pod = obj["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            backend = [a for a in container.get("args", []) if a.startswith("--gpu-backend")]
            if not backend:
                continue
            assert backend == ["--gpu-backend=sim:/var/lib/kubegpu-sim/node.json"], (name, container["name"])
            assert {"name": "gpu-sim", "mountPath": "/var/lib/kubegpu-sim"} in container["volumeMounts"]
            assert volumes["gpu-sim"]["hostPath"] == {"path": "/var/lib/kubegpu-sim", "type": "Directory"}
            checked += 1
    assert checked == 11  # device plugin, MPS daemon, exporter, GFD, MIG manager, partition agent, DRA + 4 validations
    assert not any("gpu-sim" in str(o) for n, o in workloads({}).items())


def test_a_bad_gpu_backend_is_refused_naming_the_field() -> None:
    for bad in ("cuda", "sim:relative.json", "sim:/no/json/suffix"):
        with pytest.raises(ConfigError, match=r"spec\.gpuBackend"):
            policy({"gpuBackend": bad})
