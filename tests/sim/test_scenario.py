"""Scenario files: valid ones load, bad ones fail with one line naming the file and the field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubegpu.errors import ConfigError
from kubegpu.sim.scenario import default_scenario, load_scenario
from kubegpu.sim.units import parse_duration

GOOD = {
    "cluster": {"nodeGroups": [
        {"name": "h100", "count": 2, "gpuModel": "H100-SXM5-80GB", "pricePerHour": 55.0},
        {"name": "a100", "count": 1, "gpuModel": "A100-SXM4-80GB", "pricePerHour": 27.0},
    ]},
    "workload": {"classes": [{"name": "ci", "arrivalsPerHour": 5, "memoryGiB": [1, 4], "compute": 0.2,
                              "runtime": "10m"}]},
    "duration": "2h",
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, data: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_scenario(write(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_good_scenario_loads_with_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, GOOD))
    assert scenario.duration == 7200.0
    assert scenario.cluster.node_groups[0].gpus_per_node == 8
    assert scenario.workload.classes is not None
    assert scenario.workload.classes[0].runtime == (600.0, 600.0)
    assert scenario.strategies[0] == "exclusive"


def test_unknown_gpu_model_names_the_field_path(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["cluster"]["nodeGroups"][1]["gpuModel"] = "X"
    assert error_of(tmp_path, data) == "scenario.yaml: cluster.nodeGroups[1].gpuModel: unknown GPU model 'X'"


def test_unknown_field_is_rejected(tmp_path: Path) -> None:
    data = {**GOOD, "durration": "1h"}
    assert error_of(tmp_path, data) == "scenario.yaml: durration: unknown field"


def test_bad_duration_names_the_field(tmp_path: Path) -> None:
    message = error_of(tmp_path, {**GOOD, "duration": "a day"})
    assert message.startswith("scenario.yaml: duration: ")
    assert "'a day'" in message


def test_missing_field_names_the_path(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    del data["workload"]["classes"][0]["compute"]
    assert error_of(tmp_path, data) == "scenario.yaml: workload.classes[0].compute: required field is missing"


def test_compute_need_must_be_a_fraction(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["workload"]["classes"][0]["compute"] = [0.5, 2]
    assert "workload.classes[0].compute: compute need is a fraction" in error_of(tmp_path, data)


def test_reversed_runtime_range_names_the_runtime_field(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["workload"]["classes"][0]["runtime"] = ["6h", "1h"]
    assert error_of(tmp_path, data) == ("scenario.yaml: workload.classes[0].runtime: expected a positive duration "
                                        "or [low, high] with low <= high")


def test_workload_needs_exactly_one_source(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["workload"]["trace"] = "jobs.csv"
    assert "workload: give exactly one of" in error_of(tmp_path, data)


def test_duplicate_group_names_are_rejected(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["cluster"]["nodeGroups"][1]["name"] = "h100"
    assert "duplicate node group name 'h100'" in error_of(tmp_path, data)


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("cluster: [unclosed\n")
    with pytest.raises(ConfigError, match=r"^.*broken.yaml:\d+:\d+: invalid YAML: .*$"):
        load_scenario(path)
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read: No such file"):
        load_scenario(tmp_path / "absent.yaml")


def test_durations_parse_with_units() -> None:
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration(90) == 90.0
    assert parse_duration("2d") == 172800.0
    with pytest.raises(ValueError):
        parse_duration("-5m")


def test_the_shipped_default_scenario_is_valid_and_realistic() -> None:
    scenario = default_scenario()
    models = {group.gpu_model for group in scenario.cluster.node_groups}
    assert models == {"H100-SXM5-80GB", "A100-SXM4-80GB"}
    assert all(group.gpus_per_node == 8 and group.price_per_hour > 0 for group in scenario.cluster.node_groups)
    assert scenario.workload.classes is not None
    names = {job_class.name for job_class in scenario.workload.classes}
    assert {"training", "llm-serving", "batch-inference", "notebook", "ci"} <= names
    assert {"exclusive", "time-slicing:4", "static-mig:all-balanced"} <= set(scenario.strategies)
