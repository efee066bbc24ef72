"""Rolling driver upgrades: the state machine driven through a small node/pod world until every node is done."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubegpu.operator.policy import UpgradePolicy
from kubegpu.operator.upgrade import (
    CORDON,
    DONE,
    FAILED,
    IN_PROGRESS,
    POD_DELETION,
    REQUIRED,
    VALIDATION,
    Action,
    NodeView,
    PodView,
    max_unavailable,
    plan_upgrades,
)


@dataclass
class World:
    """Nodes with a driver revision, GPU pods (some behind a PDB), and a clock; evictions honour the PDB."""

    nodes: dict[str, NodeView]
    pdb_min_available: int = 0
    pdb_pods: set[str] = field(default_factory=set)  # pod names the PDB covers
    bad_nodes: set[str] = field(default_factory=set)  # the new driver fails here
    now: float = 0.0
    max_past_cordon: int = 0
    evictions_refused: int = 0
    history: list[Action] = field(default_factory=list)

    def pdb_healthy(self) -> int:
        return sum(1 for n in self.nodes.values() for p in n.pods if p.name in self.pdb_pods)

    def apply(self, actions: list[Action]) -> None:
        self.history += actions
        for action in actions:
            node = self.nodes[action.node]
            if action.kind == "set-state":
                node.state, node.since = action.value, self.now
            elif action.kind == "cordon":
                node.unschedulable, node.cordoned_by_us = True, True
            elif action.kind == "uncordon":
                node.unschedulable, node.cordoned_by_us = False, False
            elif action.kind in ("evict", "delete-pod"):
                self.evict(node, action.value.split("/")[1], force=action.kind == "delete-pod")
            elif action.kind == "restart-driver":
                node.driver_outdated = False
                node.driver_ready = action.node not in self.bad_nodes
                node.driver_failing = action.node in self.bad_nodes
                node.validated = node.driver_ready

    def evict(self, node: NodeView, pod_name: str, force: bool) -> None:
        pod = next(p for p in node.pods if p.name == pod_name)
        if pod.name in self.pdb_pods and not force and self.pdb_healthy() - 1 < self.pdb_min_available:
            self.evictions_refused += 1  # 429 from the Eviction API: retried next pass
            return
        node.pods.remove(pod)
        # the workload's controller recreates the pod on a schedulable node that is not upgrading
        target = next((n for n in sorted(self.nodes.values(), key=lambda n: n.name)
                       if not n.unschedulable and n.state not in IN_PROGRESS and n is not node), None)
        if target is not None:
            target.pods.append(PodView(pod.namespace, pod.name + "-r", uses_gpu=pod.uses_gpu))
            if pod.name in self.pdb_pods:
                self.pdb_pods.add(pod.name + "-r")

    def run(self, policy: UpgradePolicy, passes: int = 200) -> None:
        for _ in range(passes):
            self.apply(plan_upgrades(policy, list(self.nodes.values()), self.now))
            past = sum(1 for n in self.nodes.values() if n.state in IN_PROGRESS and n.state != CORDON)
            self.max_past_cordon = max(self.max_past_cordon, past)
            self.now += 5.0
            if self.now > 10 and all(n.state == DONE for n in self.nodes.values()):
                break


def six_nodes(**extra: Any) -> dict[str, NodeView]:
    nodes = {}
    for i in range(6):
        pods = [PodView("ml", f"train-{i}", uses_gpu=True), PodView("kube-system", f"ds-{i}", daemonset=True),
                PodView("web", f"web-{i}")]
        nodes[f"gpu-{i}"] = NodeView(f"gpu-{i}", state=DONE, driver_outdated=True, driver_pod=f"gpu/driver-{i}",
                                     pods=pods, **extra)
    return nodes


def test_six_nodes_two_at_a_time_all_upgraded_and_uncordoned() -> None:
    world = World(six_nodes())
    policy = UpgradePolicy(maxParallelUpgrades=2, maxUnavailable="100%")
    world.run(policy)
    assert all(n.state == DONE for n in world.nodes.values())
    assert all(not n.unschedulable and not n.driver_outdated for n in world.nodes.values())
    assert world.max_past_cordon == 2
    restarted = [a.node for a in world.history if a.kind == "restart-driver"]
    assert sorted(restarted) == sorted(world.nodes)


def test_max_unavailable_bounds_parallelism_too() -> None:
    world = World(six_nodes())
    world.run(UpgradePolicy(maxParallelUpgrades=0, maxUnavailable="25%"))  # 25% of 6 → 2
    assert world.max_past_cordon == 2 and all(n.state == DONE for n in world.nodes.values())
    assert max_unavailable(UpgradePolicy(maxUnavailable=1), 6) == 1


def test_pdb_is_respected_through_the_eviction_api() -> None:
    world = World(six_nodes(), pdb_min_available=6, pdb_pods={f"train-{i}" for i in range(6)})
    policy = UpgradePolicy(maxParallelUpgrades=2, maxUnavailable="100%", podDeletion={"timeoutSeconds": 0})
    world.run(policy, passes=40)
    assert world.evictions_refused > 0
    assert world.pdb_healthy() >= 6  # never below minAvailable
    assert all(n.state in (POD_DELETION, DONE, REQUIRED) or n.state == CORDON or n.state.endswith("required")
               for n in world.nodes.values())
    assert not any(a.kind == "delete-pod" for a in world.history)  # no force: PDB never bypassed
    assert not any(a.kind == "restart-driver" for a in world.history)


def test_pod_deletion_timeout_without_force_fails_the_node_not_the_pdb() -> None:
    world = World(six_nodes(), pdb_min_available=6, pdb_pods={f"train-{i}" for i in range(6)})
    world.run(UpgradePolicy(maxParallelUpgrades=1, podDeletion={"timeoutSeconds": 30}), passes=12)
    failed = world.nodes["gpu-0"]
    assert failed.state == FAILED and world.pdb_healthy() >= 6
    assert not failed.unschedulable  # the old driver still serves: handed back to workloads
    assert world.nodes["gpu-1"].state in IN_PROGRESS  # the others go on
    world.run(UpgradePolicy(maxParallelUpgrades=1, podDeletion={"timeoutSeconds": 30}), passes=130)
    first_failure = world.history.index(Action("set-state", "gpu-0", FAILED))
    assert Action("set-state", "gpu-0", REQUIRED) in world.history[first_failure:]  # retried after the back-off


def test_failed_node_recovers_by_itself_and_others_proceed() -> None:
    world = World(six_nodes(), bad_nodes={"gpu-1"})
    policy = UpgradePolicy(maxParallelUpgrades=2, maxUnavailable="100%")
    world.run(policy, passes=60)
    assert world.nodes["gpu-1"].state == FAILED and world.nodes["gpu-1"].unschedulable
    assert all(world.nodes[f"gpu-{i}"].state == DONE for i in (0, 2, 3, 4, 5))
    # an admin fixes the node (or the driver pod recovers): the node leaves upgrade-failed and is uncordoned
    fixed = world.nodes["gpu-1"]
    fixed.driver_ready, fixed.validated, fixed.driver_failing = True, True, False
    world.run(policy, passes=5)
    assert fixed.state == DONE and not fixed.unschedulable


def test_wait_for_jobs_then_drain() -> None:
    node = NodeView("n", state=REQUIRED, driver_outdated=True,
                    pods=[PodView("ml", "job", uses_gpu=False, matches_wait_selector=True),
                          PodView("web", "api")])
    world = World({"n": node})
    policy = UpgradePolicy(waitForCompletion={"podSelector": "job=true"}, drain={"enable": True})
    world.run(policy, passes=4)
    assert node.state == "wait-for-jobs-required"
    node.pods[0] = PodView("ml", "job", matches_wait_selector=True, finished=True)
    world.run(policy, passes=20)
    assert node.state == DONE
    assert any(a.kind == "evict" and a.value == "web/api" for a in world.history)  # drained


def test_admin_cordoned_node_stays_cordoned() -> None:
    node = NodeView("n", state=DONE, driver_outdated=True, unschedulable=True)
    world = World({"n": node})
    world.run(UpgradePolicy(), passes=20)
    assert node.state == DONE and node.unschedulable
    assert not any(a.kind in ("cordon", "uncordon") for a in world.history)


def test_auto_upgrade_off_does_nothing() -> None:
    world = World(six_nodes())
    assert plan_upgrades(UpgradePolicy(autoUpgrade=False), list(world.nodes.values()), 0.0) == []


def test_validation_timeout_fails() -> None:
    node = NodeView("n", state=VALIDATION, since=0.0)
    assert plan_upgrades(UpgradePolicy(), [node], 599.0) == []
    assert plan_upgrades(UpgradePolicy(), [node], 600.0) == [Action("set-state", "n", FAILED)]


def test_validator_older_than_the_new_driver_is_restarted() -> None:
    """The validator pod deleted with the old driver can be recreated by its DaemonSet before the new driver pod is:
    it then predates the driver and never validates it; it is restarted instead of waiting for the timeout."""
    node = NodeView("n", state=VALIDATION, since=0.0, driver_ready=True, validator_stale=True)
    assert plan_upgrades(UpgradePolicy(), [node], 10.0) == [Action("restart-validator", "n")]
    node.validator_stale, node.validated = False, True
    assert plan_upgrades(UpgradePolicy(), [node], 11.0)[0].kind == "set-state"
