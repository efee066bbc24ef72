"""One test per input defect of issue #18; each failed (traceback, hang or OOM) before the input layer existed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kubegpu.autoscaler.cli import load_manifests
from kubegpu.autoscaler.instancetypes import load_instance_types
from kubegpu.config.deviceplugin import MAX_REPLICAS, parse_device_plugin_config
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import (
    CorruptStateError,
    dumps_checked,
    load_data_file,
    load_yaml_file,
    loads_checked,
    parse_json_text,
    parse_yaml_text,
    read_text,
    write_durable,
)
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
from kubegpu.partitioner.snapshot import load_state
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sim.scenario import load_scenario

LOADERS = {
    "scenario": load_scenario,
    "state": load_state,
    "pods": lambda path: load_manifests(Path(path), "Pod"),
    "instance-types": load_instance_types,
    "sim-node": lambda path: SimulatedBackend(path).devices(),
    "config": load_yaml_file,
}
BAD_BYTES = b"\xff\xfe\x80 not utf-8\n"
DEEP = "[" * 5000 + "]" * 5000
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def _one_line(exc: pytest.ExceptionInfo[ConfigError], path: Path) -> None:
    assert "\n" not in exc.value.message and str(path) in exc.value.message


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_non_utf8_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("in.json" if kind in ("instance-types", "sim-node") else "in.yaml")
    path.write_bytes(BAD_BYTES)
    with pytest.raises(ConfigError) as exc:
        LOADERS[kind](path)
    _one_line(exc, path)
    assert "UTF-8" in exc.value.message


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_deep_nesting_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("in.json" if kind in ("instance-types", "sim-node") else "in.yaml")
    path.write_text(DEEP)
    with pytest.raises(ConfigError) as exc:
        LOADERS[kind](path)
    _one_line(exc, path)
    assert "nested deeper" in exc.value.message or "nesting depth" in exc.value.message


@pytest.mark.parametrize("kind", ["scenario", "state", "pods", "config"])
def test_billion_laughs_is_refused_before_expansion(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)  # 10^9 leaves once expanded
    with pytest.raises(ConfigError, match="aliases expand to more than"):
        LOADERS[kind](path)


def test_small_alias_use_still_works() -> None:
    assert parse_yaml_text("a: &x {k: 1}\nb: *x\n", "f.yaml") == {"a": {"k": 1}, "b": {"k": 1}}


def test_recursive_alias_is_refused() -> None:
    with pytest.raises(ConfigError, match="refers to its own enclosing node"):
        parse_yaml_text("a: &x [1, *x]\n", "f.yaml")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_dev_zero_is_bounded(kind: str) -> None:
    # the sim-node backend only opens regular files; every other reader stops at its limit
    with pytest.raises(KubegpuError, match=r"larger than the|not found"):
        LOADERS[kind]("/dev/zero")


def test_huge_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(ConfigError, match=r"big\.yaml: file is larger than the 32 MiB limit"):
        read_text(path)


@pytest.mark.parametrize("text", ["1e400", "-1e400", "1E999999", "1e" + "9" * 5000])
def test_quantity_overflow_is_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match="must be a finite number"):
        parse_quantity(text)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400])
def test_quantity_non_finite_number_is_one_line(value: float) -> None:
    with pytest.raises(ConfigError, match="must be a finite number"):
        parse_quantity(value)


def test_json_refuses_infinity_nan_and_overflow() -> None:
    for text in ("[Infinity]", "[NaN]", "[1e400]"):
        with pytest.raises(ConfigError, match="invalid JSON"):
            parse_json_text(text, "f.json")


def _node_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus="1xA100-SXM4-80GB")
    return path


@pytest.mark.parametrize("field,value", [("power_w", "Infinity"), ("energy_mj", "1e308"), ("gpu_util", "NaN")])
def test_sim_node_file_with_non_finite_numbers(tmp_path: Path, field: str, value: str) -> None:
    path = _node_file(tmp_path)
    data = json.loads(path.read_text())
    del data["sha256"]  # hand-edited: the bounds check, not the checksum, must catch the number
    data["gpus"][0]["load"][field] = 0
    text = json.dumps(data).replace(f'"{field}": 0', f'"{field}": {value}')
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        SimulatedBackend(path).sample(0)
    _one_line(exc, path)
    assert "checksum" not in exc.value.message


def test_sim_gpu_spec_count_is_bounded() -> None:
    with pytest.raises(ConfigError, match="at most 64 GPUs per node"):
        parse_gpu_spec("100000000xA100-SXM4-80GB")


@pytest.mark.parametrize("values", [5, "us-east-1a", [], [3], None])
def test_instance_type_requirement_values_not_a_list(tmp_path: Path, values: object) -> None:
    path = tmp_path / "types.json"
    path.write_text(json.dumps([{
        "name": "x.large", "resources": {"cpu": "4", "memory": "16Gi"},
        "offerings": [{"Price": 1.0, "Requirements": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": values},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}],
    }]))
    with pytest.raises(ConfigError, match=r"Requirements\[0\]\.values: must be a non-empty list of strings"):
        load_instance_types(path)


def test_time_slicing_replicas_are_bounded() -> None:
    doc = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu",
                                                                        "replicas": 100_000_000}]}}}
    with pytest.raises(ConfigError, match=rf"replicas: must be at most {MAX_REPLICAS} \(MAX_REPLICAS"):
        parse_device_plugin_config(doc, "cfg.yaml")
    doc["sharing"]["timeSlicing"]["resources"][0]["replicas"] = MAX_REPLICAS
    assert parse_device_plugin_config(doc, "cfg.yaml").sharing.time_slicing is not None


def test_config_models_refuse_inf_and_nan() -> None:
    with pytest.raises(ConfigError):
        parse_device_plugin_config(parse_yaml_text("flags: {gfd: {sleepInterval: 1e400h}}", "c.yaml"), "c.yaml")


def test_yaml_integer_with_too_many_digits_is_one_line() -> None:
    with pytest.raises(ConfigError, match="invalid YAML value"):
        parse_yaml_text("a: " + "9" * 5000, "f.yaml")


def test_load_data_file_picks_json_by_extension(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"a": 1}')
    (tmp_path / "b.yaml").write_text("a: 1")
    assert load_data_file(tmp_path / "a.json") == load_data_file(tmp_path / "b.yaml") == {"a": 1}


# ---------------------------------------------------------------------------------------------- durable writes


def test_write_durable_replaces_atomically_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    target.write_text("old")
    write_durable(target, "new", mode=0o640)
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_write_durable_removes_its_temp_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.yaml"
    target.write_text("old")

    def broken_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(ConfigError, match=r"out\.yaml: cannot write: No space left on device"):
        write_durable(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_write_durable_sweeps_temps_of_killed_writers(tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    stale = tmp_path / ".out.yaml.abc123.tmp"
    fresh = tmp_path / ".out.yaml.def456.tmp"
    stale.write_text("half")
    fresh.write_text("in progress")
    os.utime(stale, (1, 1))
    write_durable(target, "x")
    assert not stale.exists() and fresh.exists()  # a concurrent writer's fresh temp is left alone


def test_export_to_a_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write"):
        write_durable(tmp_path, "x")


def test_checked_envelope_detects_torn_and_foreign_files() -> None:
    text = dumps_checked("kubegpu-test", 1, {"a": [1, 2]})
    assert loads_checked(text, "s.json", "kubegpu-test", 1) == {"a": [1, 2]}
    with pytest.raises(CorruptStateError, match="torn"):
        loads_checked(text[: len(text) // 2], "s.json", "kubegpu-test", 1)
    with pytest.raises(CorruptStateError, match="not a other state file"):
        loads_checked(text, "s.json", "other", 1)
    with pytest.raises(CorruptStateError, match="version"):
        loads_checked(text, "s.json", "kubegpu-test", 2)
    with pytest.raises(CorruptStateError, match="checksum mismatch"):
        loads_checked(text.replace("2", "3"), "s.json", "kubegpu-test", 1)
