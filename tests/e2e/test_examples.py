"""The files in examples/ are what users copy first: each must be valid and do what its comment says."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from kubegpu.config.deviceplugin import load_device_plugin_config
from kubegpu.config.migparted import default_mig_parted_config, load_mig_parted_config
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.devices import allocatable
from tests.e2e.cli import EXAMPLES, REPO, invoke

# Every example with a `kubegpu validate-config` kind, and the kind it must be recognised as.
VALIDATED = {
    "device-plugin-time-slicing.yaml": "device-plugin config",
    "device-plugin-mixed-sharing.yaml": "device-plugin config",
    "device-plugin-mig-mixed.yaml": "device-plugin config",
    "mig-parted.yaml": "mig-parted config",
    "nodepool-gpu.yaml": "NodePool",
    "scenario-small.yaml": "scenario",
    "scenario-teams.yaml": "scenario",
}
PLAN_STATE = EXAMPLES / "plan-state.yaml"  # no validator kind: checked by running `kubegpu plan` on it
REAL_NODE_PODS = EXAMPLES / "real-node-pods.yaml"  # Kubernetes objects: run on the real node (tests/node)
FRACTIONAL = EXAMPLES / "fractional-gpu.yaml"  # Kubernetes objects: allocated in tests/dra/test_fractional.py


def test_every_example_is_accounted_for() -> None:
    accounted = {*VALIDATED, PLAN_STATE.name, REAL_NODE_PODS.name, FRACTIONAL.name}
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == accounted


def test_validate_config_accepts_every_example_as_its_kind() -> None:
    result = invoke("validate-config", *(EXAMPLES / name for name in VALIDATED))
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(VALIDATED)
    for name, kind in VALIDATED.items():
        line = next(line for line in lines if line.startswith(f"{EXAMPLES / name}:"))
        assert f": valid {kind}" in line, line


def test_validate_config_rejects_a_broken_example_in_one_line(tmp_path: Path) -> None:
    broken = yaml.safe_load((EXAMPLES / "device-plugin-time-slicing.yaml").read_text())
    broken["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 1
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = invoke("validate-config", path, expect=1)
    assert len(result.stderr.strip().splitlines()) == 1
    assert "replicas" in result.stderr and str(path) in result.stderr


def _a100_node(gpus: int = 8) -> SimulatedBackend:
    return SimulatedBackend(None, gpus=f"{gpus}xA100-SXM4-80GB")


def test_time_slicing_example_advertises_four_replicas_per_gpu_under_the_same_name() -> None:
    config = load_device_plugin_config(EXAMPLES / "device-plugin-time-slicing.yaml")
    assert allocatable(_a100_node().devices(), {}, config) == {"nvidia.com/gpu": 32}


def test_mixed_sharing_example_keeps_half_the_gpus_exclusive() -> None:
    config = load_device_plugin_config(EXAMPLES / "device-plugin-mixed-sharing.yaml")
    assert allocatable(_a100_node().devices(), {}, config) == {"nvidia.com/gpu": 4, "nvidia.com/gpu.shared": 16}


def test_mig_parted_example_is_what_the_generator_gives_for_every_mig_model_in_the_catalog() -> None:
    """Regenerate with the two commands in the file's header when the catalog changes."""
    shipped = load_mig_parted_config(EXAMPLES / "mig-parted.yaml")
    generated = default_mig_parted_config([m for m in CATALOG.values() if m.mig_capable])
    assert shipped.model_dump(by_alias=True) == generated.model_dump(by_alias=True)
    assert {"all-disabled", "all-enabled", "all-balanced"} <= set(shipped.model_dump(by_alias=True)["mig-configs"])


def test_mig_parted_example_header_commands_regenerate_it(tmp_path: Path) -> None:
    """The two commands in the file's header, run as written (in-process), give the shipped config."""
    header = [line.removeprefix("#").strip() for line in (EXAMPLES / "mig-parted.yaml").read_text().splitlines()
              if line.startswith("#   kubegpu ")]
    create, generate = (line.split()[1:] for line in header)
    assert create[:2] == ["sim-node", "create"] and generate[:2] == ["mig-parted", "generate-config"]
    node_file = tmp_path / "all.json"
    invoke(*(str(node_file) if arg == "all.json" else arg for arg in create))
    out = tmp_path / "generated.yaml"
    invoke(*(f"sim:{node_file}" if arg == "sim:all.json" else arg for arg in generate), "--output", out)
    assert yaml.safe_load(out.read_text()) == yaml.safe_load((EXAMPLES / "mig-parted.yaml").read_text())


def test_plan_state_example_plans_every_pending_pod_without_moving_the_slice_in_use() -> None:
    plan = json.loads(invoke("plan", "--state", PLAN_STATE, "-o", "json").stdout)
    state = yaml.safe_load(PLAN_STATE.read_text())
    assert sorted(plan["schedulable"]) == sorted(p["name"] for p in state["pods"])
    assert plan["unschedulable"] == []
    node_a = next(n for n in plan["nodes"] if n["name"] == "node-a")
    gpu0 = next(g for g in node_a["gpus"] if g["index"] == 0)
    assert {"profile": "1g.10gb", "start": 0} in gpu0["instances"]  # in use in the state file: kept in place
    assert gpu0["destroyed"] == 0


def test_nodepool_example_provisions_an_a100_node_for_a_mig_pod(tmp_path: Path) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer", "namespace": "default"},
        "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]},
    }
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump([pod]))
    result = json.loads(invoke("provision", "--nodepools", EXAMPLES / "nodepool-gpu.yaml", "--pods", pods,
                           "-o", "json").stdout)
    assert result["unschedulable"] == []
    [claim] = result["nodeclaims"]
    assert claim["nodepool"] == "gpu-a100-mig" and claim["pods"] == ["infer"]


def test_nodepool_example_passes_the_crd_schema_kubectl_would_check() -> None:
    crd = yaml.safe_load((REPO / "deploy" / "crds" / "nodepools.kubegpu.io.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    jsonschema.validate(yaml.safe_load((EXAMPLES / "nodepool-gpu.yaml").read_text()),
                        version["schema"]["openAPIV3Schema"])


def test_scenario_example_runs_every_strategy_it_lists(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    invoke("simulate", "--scenario", EXAMPLES / "scenario-small.yaml", "--json", out)
    result = json.loads(out.read_text())
    listed = yaml.safe_load((EXAMPLES / "scenario-small.yaml").read_text())["strategies"]
    assert len(result["strategies"]) == len(listed)
    assert result["gpus"] == 8 and result["jobs"] > 0
    assert all(s["pods_completed"] > 0 for s in result["strategies"])
