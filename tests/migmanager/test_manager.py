"""The MIG manager on MemoryCluster + SimulatedBackend: states, paused clients always restored, Events, races."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.config.migparted import MigPartedConfig, default_mig_parted_config, parse_mig_parted_config
from kubegpu.gpu.backend import GpuBackendError, MigDevice
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube import MemoryCluster
from kubegpu.migmanager.cli import config_map_loader
from kubegpu.migmanager.manager import MIG_CONFIG_LABEL, MIG_STATE_LABEL, PAUSED, MigManager
from kubegpu.sharing.migapply import assert_mismatches, read_state

NODE = "gpu-node-1"
RUNNING = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")
DEPLOY = {f"nvidia.com/gpu.deploy.{c}": "true" for c in RUNNING} | {"nvidia.com/gpu.deploy.nvsm": "false"}


def h100_config() -> MigPartedConfig:
    base = default_mig_parted_config([CATALOG["H100-SXM5-80GB"]]).model_dump(by_alias=True, exclude_none=True)
    base["mig-configs"]["too-big"] = [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1,
                                                                                             "1g.10gb": 1}}]
    return parse_mig_parted_config(base, "test mig-parted config")


def make_node(cluster: MemoryCluster, **labels: str) -> None:
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {**DEPLOY, **labels}}})


def labels(cluster: MemoryCluster) -> dict[str, str]:
    return dict(cluster.get("Node", NODE)["metadata"]["labels"])


def set_label(cluster: MemoryCluster, value: str) -> None:
    cluster.patch("Node", NODE, {"metadata": {"labels": {MIG_CONFIG_LABEL: value}}})


def state_history(cluster: MemoryCluster, since: str) -> list[str]:
    """Every value `nvidia.com/mig.config.state` took after resource version `since`."""
    seen: list[str] = []
    for event in cluster.watch("Node", resource_version=since, timeout=0):
        value = event.object["metadata"].get("labels", {}).get(MIG_STATE_LABEL)
        if value is not None and (not seen or seen[-1] != value):
            seen.append(value)
    return seen


def events(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return cluster.list("Event", namespace="default")


def manager(cluster: MemoryCluster, backend: Any, config: MigPartedConfig | None = None, **kwargs: Any) -> MigManager:
    chosen = config or h100_config()
    return MigManager(cluster, backend, NODE, lambda: chosen, VirtualClock(), **kwargs)


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster(VirtualClock(1000.0))


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend.create(None, "2xH100-SXM5-80GB")


def test_label_change_applies_the_layout_and_restores_clients(
    cluster: MemoryCluster, backend: SimulatedBackend
) -> None:
    make_node(cluster)
    agent = manager(cluster, backend)
    assert agent.reconcile().applied == []  # no label yet: nothing to do
    since = cluster.resource_version
    set_label(cluster, "all-balanced")
    result = agent.reconcile()
    assert (result.applied, result.state) == (["all-balanced"], "success")
    assert assert_mismatches(h100_config(), "all-balanced", read_state(backend)) == []
    assert state_history(cluster, since) == ["pending", "success"]
    paused_seen = [e.object["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm"]
                   for e in cluster.watch("Node", resource_version=since, timeout=0)]
    assert PAUSED in paused_seen
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY  # "false" stayed "false"
    assert [e["reason"] for e in events(cluster)] == ["MigConfigApplied"]
    assert agent.reconcile().applied == []  # the same label again: nothing more


def test_already_applied_config_succeeds_without_pausing(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-disabled"})
    since = cluster.resource_version
    assert manager(cluster, backend).reconcile().state == "success"
    assert all(e.object["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
               for e in cluster.watch("Node", resource_version=since, timeout=0))


def test_invalid_layout_fails_with_event_and_no_client_left_paused(
    cluster: MemoryCluster, backend: SimulatedBackend
) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "too-big"})
    before = read_state(backend)
    since = cluster.resource_version
    result = manager(cluster, backend).reconcile()
    assert result.state == "failed"
    assert state_history(cluster, since) == ["pending", "failed"]  # answered like any request, never paused
    assert labels(cluster)[MIG_STATE_LABEL] == "failed"
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY
    assert read_state(backend) == before
    (event,) = events(cluster)
    assert event["type"] == "Warning" and "too-big" in event["message"] and "does not fit" in event["message"]


def test_unknown_config_name_fails(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balancd"})
    assert manager(cluster, backend).reconcile().state == "failed"
    assert "all-balancd" in events(cluster)[0]["message"]


class FailingBackend:
    """The simulated node, with a driver that fails the n-th GPU-instance creation."""

    def __init__(self, inner: SimulatedBackend, fail_at: int) -> None:
        self.inner, self.fail_at, self.creates = inner, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
        self.creates += 1
        if self.creates == self.fail_at:
            raise GpuBackendError(f"NVML: Insufficient Resources creating profile {profile_id} on GPU {index}")
        return self.inner.create_mig_device(index, profile_id, start)


def test_failure_mid_apply_restores_every_paused_label_and_says_partial(
    cluster: MemoryCluster, backend: SimulatedBackend
) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced", "nvidia.com/gpu.deploy.gpu-feature-discovery": PAUSED})
    result = manager(cluster, FailingBackend(backend, fail_at=6)).reconcile()  # GPU 0 done, GPU 1 half done
    assert result.state == "failed"
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY  # a crashed run's pause undone too
    (event,) = events(cluster)
    assert event["reason"] == "MigConfigFailed"
    assert "partially applied" in event["message"] and "GPU 1" in event["message"] and "[0]" in event["message"]


def test_in_use_instance_is_not_destroyed(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    agent = manager(cluster, backend)
    assert agent.reconcile().state == "success"
    busy = read_state(backend).instances(0)[0]
    backend.add_process(0, pid=99, used_memory_mib=10, gi_id=busy.gi_id)
    set_label(cluster, "all-7g.80gb")
    assert agent.reconcile().state == "failed"
    assert busy.uuid in {d.uuid for d in read_state(backend).instances(0)}
    (failure,) = [e for e in events(cluster) if e["reason"] == "MigDeviceInUse"]
    assert "pid 99" in failure["message"] and "all-7g.80gb" in failure["message"]
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY


def test_second_label_change_during_apply_newest_wins(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})

    class Racing(FailingBackend):
        def create_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
            if self.creates == 0:  # while the first apply runs, the label changes twice
                set_label(cluster, "all-3g.40gb")
                set_label(cluster, "all-1g.20gb")
            self.creates += 1
            return self.inner.create_mig_device(index, profile_id, start)

    result = manager(cluster, Racing(backend, fail_at=0)).reconcile()
    assert result.applied == ["all-balanced", "all-1g.20gb"]  # the intermediate value is skipped
    assert result.state == "success" and labels(cluster)[MIG_STATE_LABEL] == "success"
    assert assert_mismatches(h100_config(), "all-1g.20gb", read_state(backend)) == []


class NoResetBackend(FailingBackend):
    """A node that cannot reset GPUs (a VM): a pending Ampere mode change needs a reboot."""

    def reset_gpu(self, index: int) -> None:
        raise GpuBackendError(f"GPU {index}: reset not supported in this VM")


def test_mode_change_needing_reset_reboots_when_allowed(cluster: MemoryCluster) -> None:
    ampere = SimulatedBackend.create(None, "2xA100-SXM4-80GB")
    config = default_mig_parted_config([CATALOG["A100-SXM4-80GB"]])
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    reboots: list[bool] = []
    agent = manager(cluster, NoResetBackend(ampere, 0), config, with_reboot=True, reboot=lambda: reboots.append(True))
    assert agent.reconcile().state == "rebooting"
    assert reboots == [True] and labels(cluster)[MIG_STATE_LABEL] == "rebooting"
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY
    ampere.reboot()  # the node comes back with MIG on; the restarted agent finishes the layout
    restarted = manager(cluster, ampere, config)
    assert restarted.reconcile().state == "success"
    assert assert_mismatches(config, "all-balanced", read_state(ampere)) == []


def test_mode_change_needing_reset_fails_without_reboot(cluster: MemoryCluster) -> None:
    ampere = SimulatedBackend.create(None, "1xA100-SXM4-80GB")
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    agent = manager(cluster, NoResetBackend(ampere, 0), default_mig_parted_config([CATALOG["A100-SXM4-80GB"]]))
    assert agent.reconcile().state == "failed"
    assert "--with-reboot" in events(cluster)[0]["message"]


def test_waits_for_client_pods_to_leave_the_node(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    for name, node in (("plugin-abc", NODE), ("plugin-other", "gpu-node-2")):
        cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "gpu-operator", "labels": {"app": "nvidia-device-plugin-daemonset"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the DaemonSet controller removes the paused pod
        slept.append(seconds)
        cluster.delete("Pod", "plugin-abc", "gpu-operator")

    agent = manager(cluster, backend, gpu_clients_namespace="gpu-operator", sleep=sleep)
    assert agent.reconcile().state == "success"
    assert slept == [1.0]


def test_client_pods_that_never_stop_fail_the_change(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "dcgm-1", "namespace": "gpu-operator", "labels": {"app": "nvidia-dcgm"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]}})
    clock = VirtualClock()
    chosen = h100_config()
    agent = MigManager(cluster, backend, NODE, lambda: chosen, clock, gpu_clients_namespace="gpu-operator",
                       pod_wait_timeout=5.0, sleep=clock.advance)
    assert agent.reconcile().state == "failed"
    assert read_state(backend).gpus[0].mig_enabled is False  # nothing applied while a client still ran
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY


def test_config_map_source(cluster: MemoryCluster) -> None:
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mig-parted", "namespace": "gpu"},
                    "data": {"config.yaml": h100_config().to_yaml()}})
    assert "all-balanced" in config_map_loader(cluster, "gpu/mig-parted").mig_configs
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "broken", "namespace": "gpu"},
                    "data": {"config.yaml": "version: v2\nmig-configs: {}\n"}})
    with pytest.raises(Exception, match=r"ConfigMap gpu/broken key config\.yaml"):
        config_map_loader(cluster, "gpu/broken")
    with pytest.raises(Exception, match="NAMESPACE/NAME"):
        config_map_loader(cluster, "no-slash")


def test_watch_loop_follows_label_changes_until_stopped(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    import threading

    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-node"}})
    agent = manager(cluster, backend)
    stop = threading.Event()
    done = threading.Event()
    states: list[str] = []

    first = threading.Event()

    def on_node(event: Any) -> None:
        node = event.object
        if node["metadata"]["name"] != NODE:
            return
        state = node["metadata"].get("labels", {}).get(MIG_STATE_LABEL)
        selected = node["metadata"]["labels"].get(MIG_CONFIG_LABEL)
        if selected == "all-balanced" and state in ("success", "failed"):
            first.set()
        elif selected == "all-3g.40gb":  # the state label still says the old config's result until `pending`
            if (state == "pending" or states) and (not states or states[-1] != state):
                states.append(state)
            if state in ("success", "failed") and states:
                done.set()

    cluster.subscribe("Node", on_node)
    worker = threading.Thread(target=agent.run, args=(stop, 0.05), daemon=True)
    worker.start()
    assert first.wait(20), "the agent never finished the first config"
    cluster.patch("Node", "other-node", {"metadata": {"labels": {MIG_CONFIG_LABEL: "all-7g.80gb"}}})  # not ours
    set_label(cluster, "all-3g.40gb")
    assert done.wait(20), "the agent never finished the second config"
    stop.set()
    worker.join(20)
    assert not worker.is_alive()
    assert states == ["pending", "success"]
    assert assert_mismatches(h100_config(), "all-3g.40gb", read_state(backend)) == []
    assert agent.last_handled == "all-3g.40gb"


def test_unexpected_error_during_apply_still_fails_and_restores(
    cluster: MemoryCluster, backend: SimulatedBackend
) -> None:
    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})

    class Crashing(FailingBackend):
        reads = 0

        def processes(self, index: int) -> Any:
            Crashing.reads += 1
            if Crashing.reads > 2:  # the re-check after pausing the clients blows up
                raise RuntimeError("driver went away")
            return self.inner.processes(index)

    assert manager(cluster, Crashing(backend, 0)).reconcile().state == "failed"
    assert {k: v for k, v in labels(cluster).items() if k in DEPLOY} == DEPLOY
    assert "RuntimeError: driver went away" in events(cluster)[0]["message"]


def test_run_survives_an_api_failure_and_retries(cluster: MemoryCluster, backend: SimulatedBackend) -> None:
    import threading

    from kubegpu.kube import ApiError

    make_node(cluster, **{MIG_CONFIG_LABEL: "all-balanced"})
    stop = threading.Event()

    class Flaky:
        failures = 1

        def __getattr__(self, name: str) -> Any:
            return getattr(cluster, name)

        def watch(self, *args: Any, **kwargs: Any) -> Any:
            if Flaky.failures:
                Flaky.failures -= 1
                raise ApiError("watch: connection reset by the API server")
            stop.set()  # the retried reconcile has run; end the loop
            return iter(())

    errors: list[str] = []
    chosen = h100_config()
    agent = MigManager(Flaky(), backend, NODE, lambda: chosen, VirtualClock())  # type: ignore[arg-type]
    agent.run(stop, watch_timeout=0.01, retry_after=0.0, on_error=lambda e: errors.append(str(e)))
    assert errors == ["watch: connection reset by the API server"]
    assert labels(cluster)[MIG_STATE_LABEL] == "success"
