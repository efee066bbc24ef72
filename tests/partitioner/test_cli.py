"""`kubegpu plan`: the JSON contract, the table, and one-line errors for bad state files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kubegpu.cli import main

STATE = """
nodes:
- name: node-a
  labels: {kubegpu.io/gpu-partitioning: mig, pool: gpu}
  gpus:
  - model: A100-SXM4-80GB
    instances:
    - {profile: 1g.10gb, start: 0, used: true}
    - {profile: 1g.10gb, start: 1, used: true}
    - {profile: 1g.10gb, start: 2, used: true}
    - {profile: 1g.10gb, start: 3}
    - {profile: 1g.10gb, start: 4}
    - {profile: 1g.10gb, start: 5}
    - {profile: 1g.10gb, start: 6}
- name: node-b
  gpus: [{model: Z9000}]
pods:
- {name: wants-2g, requests: {nvidia.com/mig-2g.20gb: 1}, nodeSelector: {pool: gpu}}
- {name: wants-5g, requests: {nvidia.com/mig-5g.50gb: 1}}
"""


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["kubegpu", *argv])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_plan_json_has_layouts_and_both_pod_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    assert run(["plan", "--state", str(state), "-o", "json"], monkeypatch) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["schedulable"] == ["wants-2g"]
    assert doc["unschedulable"] == ["wants-5g"]
    gpu = doc["nodes"][0]["gpus"][0]
    assert gpu["index"] == 0
    kept = [i for i in gpu["instances"] if i["start"] in (0, 1, 2)]
    assert kept == [{"profile": "1g.10gb", "start": s} for s in (0, 1, 2)]
    assert {"profile": "2g.20gb", "start": 4} in gpu["instances"]
    assert doc["nodes"][1]["gpus"][0]["error"] == "GPU model 'Z9000' is not in the catalog"
    assert captured.err == (f"warning: {state}: node node-b GPU 0: GPU model 'Z9000' is not in the catalog; "
                            "left as it is\n")


def test_plan_json_state_file_works_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"nodes": [{"name": "n", "gpus": [{"model": "H100-SXM5-80GB"}]}],
                                 "pods": [{"name": "p", "requests": {"nvidia.com/mig-7g.80gb": 1}}]}))
    assert run(["plan", "--state", str(state), "-o", "json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"][0]["gpus"][0]["instances"] == [{"profile": "7g.80gb", "start": 0}]


def test_plan_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    assert run(["plan", "--state", str(state)], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "schedulable on node-a" in out and "no partitionable GPU offers" in out


@pytest.mark.parametrize(("content", "message"), [
    ("nodes: [{name: a, gpus: [{modl: A30-24GB}]}]", "nodes[0].gpus[0].model: Field required"),
    ("nodes: [{name: a, gpus: [{model: A30-24GB, instances: [{profile: 1g.6gb}]}]}]",
     "nodes[0].gpus[0].instances[0].start: required for a MIG instance"),
    ("nodes: [{name: a, gpus: [{model: A30-24GB, instances: [{profile: 9g.1gb, start: 0}]}]}]",
     "nodes[0].gpus[0].instances[0].profile: A30-24GB has no MIG profile '9g.1gb'"),
    ("pods: [{name: p, priority: high}]", "pods[0].priority: Input should be a valid integer"),
    ("nodes: [{name: a, labels: {kubegpu.io/gpu-partitioning: tpu}}]",
     "nodes[0].labels.kubegpu.io/gpu-partitioning: must be mig or mps, not 'tpu'"),
    ("nodes: [", "invalid YAML"),
    ("nodes: [{name: a, gpus: [{model: A100-SXM4-80GB, instances: [{profile: 2g.20gb, start: 1}]}]}]",
     "nodes[0].gpus[0].instances[0].start: 2g.20gb@1: start 1 is not a legal placement"),
    ("nodes: [{name: a, gpus: [{model: A100-SXM4-80GB, instances: [{profile: 1g.10gb, start: 0}, "
     "{profile: 2g.20gb, start: 0}]}]}]", "nodes[0].gpus[0].instances[1].start: 2g.20gb@0 overlaps 1g.10gb@0"),
    ("nodes: [{name: a, labels: {kubegpu.io/gpu-partitioning: mps}, gpus: [{model: A30-24GB, "
     "instances: [{profile: 20gb}, {profile: 10gb}]}]}]", "nodes[0].gpus[0].instances: MPS slices add up to more"),
    ("nodes: [{name: a}, {name: a}]", "nodes[1]: duplicate node name 'a'"),
    ("pods: [{name: p}, {name: p, namespace: default}]", "pods[1]: duplicate pod 'default/p'"),
    ("pods: [{name: p, requests: {nvidia.com/mig-1g.10gb: lots}}]",
     "pods[0].requests.nvidia.com/mig-1g.10gb: invalid quantity 'lots'"),
    ("pods: [{name: p, requests: {nvidia.com/gpu-10gb: -1}}]",
     "pods[0].requests.nvidia.com/gpu-10gb: must not be negative"),
])
def test_bad_state_files_give_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], content: str, message: str) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(content)
    assert run(["plan", "--state", str(state), "-o", "json"], monkeypatch) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {state}:")
    assert message in err


def test_missing_state_file_and_bad_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "--state", str(tmp_path / "nope.yaml")], monkeypatch) == 1
    assert "nope.yaml: cannot read" in capsys.readouterr().err
    (tmp_path / "s.yaml").write_text("{}")
    assert run(["plan", "--state", str(tmp_path / "s.yaml"), "-o", "xml"], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Invalid value for -o/--output: 'xml' is not one of json, yaml, table" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["partitioner", "--once", "--batch-window-idle=-1"],
     "Invalid value for '--batch-idle-duration': must be at least 0 seconds, got '-1'"),
    (["partitioner", "--oneshot", "--interval", "0"], "Invalid value for '--interval': must be more than 0, got '0'"),
    (["partition-agent", "--node-name", "n", "--interval", "0s"],
     "Invalid value for '--interval': must be more than 0, got '0s'"),
    (["partitioner", "--oneshot", "--lease-duration", "soon"], "Invalid value for '--lease-duration': expected a "
     "duration such as 500ms, 60s, 2m or 1h30m (a bare number is seconds), got 'soon'"),
])
def test_bad_controller_flags_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    assert run(argv, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and message in err


def test_plan_json_states_the_objective_against_the_bound_on_a_fleet_sized_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4,096-GPU state file (512 nodes x 8) passes the input limits, and the JSON says what the plan achieves
    against the planner's bound, per priority level."""
    import yaml

    used = [{"profile": "3g.40gb", "start": 4, "used": True}]
    nodes = [{"name": f"n{k:03d}", "gpus": [{"model": "A100-SXM4-80GB" if k % 2 else "H100-SXM5-80GB",
                                             "instances": used} for _ in range(8)]} for k in range(512)]
    pods = [{"name": f"p{k}", "priority": k % 2, "requests": {"nvidia.com/mig-2g.20gb": 1}} for k in range(40)]
    state = tmp_path / "fleet.yaml"
    state.write_text(yaml.safe_dump({"nodes": nodes, "pods": pods}))
    assert run(["plan", "--state", str(state), "-o", "json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    objective = doc["objective"]
    assert objective["schedulable"] == objective["pending"] == 40
    assert objective["score"] == objective["bound"] == doc["score"] and objective["ratioToBound"] == 1.0
    assert objective["byPriority"] == [{"priority": 1, "pending": 20, "schedulable": 20},
                                       {"priority": 0, "pending": 20, "schedulable": 20}]
    assert objective["instancesChanged"] == doc["created"] + doc["destroyed"] == 40
    assert len(doc["nodes"]) == 512 and sum(len(n["gpus"]) for n in doc["nodes"]) == 4096
