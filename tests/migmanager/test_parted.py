"""mig-parted apply/assert/export/generate-config: every default config, placement-aware keeps, refusals, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.config.migparted import default_mig_parted_config, load_mig_parted_config
from kubegpu.errors import ConfigError, NotFoundError
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.geometry import PlacedInstance, is_legal
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.migapply import (
    InUseError,
    assert_mismatches,
    execute,
    export_config,
    plan_apply,
    read_state,
    target_layout,
)

MIG_MODELS = sorted(key for key, model in CATALOG.items() if model.mig_capable)


def apply(backend: SimulatedBackend, config: object, name: str, force: bool = False) -> list[int]:
    outcome = execute(plan_apply(config, name, read_state(backend), force=force), backend)  # type: ignore[arg-type]
    assert outcome.complete
    return outcome.changed


def layout(backend: SimulatedBackend) -> dict[int, list[tuple[str, int, int, str]]]:
    """GPU → (profile, start, gi, uuid) of every MIG device: what 'nothing changed' compares."""
    state = read_state(backend)
    return {g.index: [(d.profile_name, d.start, d.gi_id, d.uuid) for d in state.instances(g.index)]
            for g in state.gpus} | {-1: [(str(g.mig_enabled), int(g.mig_pending), 0, "") for g in state.gpus]}


@pytest.mark.parametrize("model_key", MIG_MODELS)
def test_every_default_config_applies_and_then_asserts(model_key: str) -> None:
    """Every config name, applied one after another on one node (so each apply starts from another layout)."""
    backend = SimulatedBackend.create(None, f"2x{model_key}")
    config = default_mig_parted_config([CATALOG[model_key]])
    names = list(config.mig_configs)
    assert {"all-disabled", "all-enabled", "all-balanced"} <= set(names)
    for name in [*names, *reversed(names)]:
        apply(backend, config, name)
        state = read_state(backend)
        assert assert_mismatches(config, name, state) == [], name
        for gpu in state.gpus:
            placed = [(d.profile_id, d.start) for d in state.instances(gpu.index)]
            assert len(set(placed)) == len(placed)


def test_cli_apply_every_default_config_then_assert_passes(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    SimulatedBackend.create(node, ",".join([*(f"1x{key}" for key in MIG_MODELS), "1xL4"]))  # one node, every model
    generated = CliRunner().invoke(app, ["mig-parted", "generate-config", "--gpu-backend", f"sim:{node}",
                                         "-o", str(tmp_path / "config.yaml")])
    assert generated.exit_code == 0, generated.output
    config = load_mig_parted_config(tmp_path / "config.yaml")
    assert all("device-filter" in e for e in yaml.safe_load((tmp_path / "config.yaml").read_text())["mig-configs"][
        "all-balanced"])  # several MIG models on the node → filtered entries
    for name in config.mig_configs:
        args = ["-f", str(tmp_path / "config.yaml"), "-c", name, "--gpu-backend", f"sim:{node}"]
        applied = CliRunner().invoke(app, ["mig-parted", "apply", *args])
        assert applied.exit_code == 0, (name, applied.output)
        asserted = CliRunner().invoke(app, ["mig-parted", "assert", *args])
        assert asserted.exit_code == 0, (name, asserted.output)
        assert asserted.output.strip() == f"config {name!r} is applied"


def test_instances_in_the_target_stay_put_and_in_use_ones_are_kept_first() -> None:
    backend = SimulatedBackend.create(None, "1xH100-SXM5-80GB")
    config = load_inline({
        "start": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4, "3g.40gb": 1}}],
        "next": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}}],
    })
    apply(backend, config, "start")
    before = {d.gi_id: d for d in read_state(backend).instances(0)}
    busy = next(d for d in before.values() if d.profile_name == "1g.10gb" and d.start == 3)
    backend.add_process(0, pid=4242, used_memory_mib=1000, gi_id=busy.gi_id)
    three_g = next(d for d in before.values() if d.profile_name == "3g.40gb")
    apply(backend, config, "next")
    after = {d.uuid: d for d in read_state(backend).instances(0)}
    assert busy.uuid in after and three_g.uuid in after  # neither re-created
    assert sorted(d.profile_name for d in after.values()) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert assert_mismatches(config, "next", read_state(backend)) == []


def test_target_layout_keeps_only_what_still_lets_the_rest_fit() -> None:
    model = CATALOG["A100-SXM4-80GB"]
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB")
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    backend.create_mig_device(0, 19, 0)  # a 1g at 0 blocks both 4g (0..3) and 7g placements
    backend.create_mig_device(0, 19, 5)
    existing = read_state(backend).instances(0)
    keep, create = target_layout(model, [5, 19], existing, busy=set())
    assert [(d.profile_id, d.start) for d in keep] == [(19, 5)]
    assert [(i.profile_id, i.start) for i in create] == [(5, 0)]
    assert is_legal(model, [*(PlacedInstance(d.profile_id, d.start) for d in keep), *create])


def test_in_use_instance_is_refused_with_one_line_and_nothing_changes() -> None:
    backend = SimulatedBackend.create(None, "2xH100-SXM5-80GB")
    config = default_mig_parted_config([CATALOG["H100-SXM5-80GB"]])
    apply(backend, config, "all-balanced")
    victim = read_state(backend).instances(1)[0]
    backend.add_process(1, pid=777, used_memory_mib=500, gi_id=victim.gi_id, name="train.py")
    before = layout(backend)
    with pytest.raises(InUseError, match=r"GPU 1: MIG device .* is used by pid 777 \(train.py\).*--force"):
        plan_apply(config, "all-7g.80gb", read_state(backend))
    assert layout(backend) == before
    forced = plan_apply(config, "all-7g.80gb", read_state(backend), force=True)
    assert victim.gi_id in {d.gi_id for d in forced.gpus[1].destroy}


def test_mode_change_on_a_busy_whole_gpu_is_refused() -> None:
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB")
    backend.add_process(0, pid=1, used_memory_mib=100)
    config = default_mig_parted_config([CATALOG["A100-SXM4-80GB"]])
    with pytest.raises(InUseError, match="not changing its MIG mode"):
        plan_apply(config, "all-balanced", read_state(backend))


def test_ampere_mode_change_pending_when_the_reset_is_refused(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, "1xA100-SXM4-80GB")
    backend.add_process(0, pid=1, used_memory_mib=100)  # a process blocks the GPU reset
    config = tmp_path / "c.yaml"
    config.write_text(default_mig_parted_config([CATALOG["A100-SXM4-80GB"]]).to_yaml())
    result = CliRunner().invoke(app, ["mig-parted", "apply", "-f", str(config), "-c", "all-balanced",
                                      "--gpu-backend", f"sim:{node}", "--force"])
    assert result.exit_code == 1
    assert_one_error_line(result.output, "pending a GPU reset")
    gpu = read_state(SimulatedBackend(node)).gpus[0]
    assert gpu.mig_pending and not gpu.mig_enabled
    skipped = CliRunner().invoke(app, ["mig-parted", "apply", "-f", str(config), "-c", "all-balanced",
                                       "--gpu-backend", f"sim:{node}", "--force", "--skip-reset"])
    assert skipped.exit_code == 1


def test_hopper_mode_change_needs_no_reset() -> None:
    backend = SimulatedBackend.create(None, "1xH100-SXM5-80GB")
    config = default_mig_parted_config([CATALOG["H100-SXM5-80GB"]])
    outcome = execute(plan_apply(config, "all-3g.40gb", read_state(backend)), backend, reset=False)
    assert outcome.complete and outcome.changed == [0]


def load_inline(configs: dict[str, object]) -> object:
    from kubegpu.config.migparted import parse_mig_parted_config

    return parse_mig_parted_config({"version": "v1", "mig-configs": configs}, "inline")


@pytest.mark.parametrize(
    ("configs", "name", "error", "words"),
    [
        ({"all-balanced": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}]},
         "all-balancd", NotFoundError, ["all-balancd"]),
        ({"odd": [{"devices": "all", "mig-enabled": True, "mig-devices": {"5g.50gb": 1}}]},
         "odd", ConfigError, ["5g.50gb", "mig-configs.odd[0].mig-devices"]),
        ({"big": [{"devices": "all", "mig-enabled": True, "mig-devices": {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}}]},
         "big", ConfigError, ["does not fit", "mig-configs.big[0]"]),
    ],
    ids=["unknown-config-name", "unknown-profile", "cannot-fit"],
)
def test_bad_input_is_one_line_and_changes_nothing(
    tmp_path: Path, configs: dict[str, object], name: str, error: type[Exception], words: list[str]
) -> None:
    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, "2xH100-SXM5-80GB")
    apply(backend, default_mig_parted_config([CATALOG["H100-SXM5-80GB"]]), "all-balanced")
    with pytest.raises(error):
        plan_apply(load_inline(configs), name, read_state(backend))  # type: ignore[arg-type]
    before = layout(backend)
    file_before = node.read_bytes()
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "mig-configs": configs}))
    result = CliRunner().invoke(app, ["mig-parted", "apply", "-f", str(config), "-c", name,
                                      "--gpu-backend", f"sim:{node}"])
    assert result.exit_code == 1
    assert_one_error_line(result.output, *words)
    assert layout(SimulatedBackend(node)) == before
    assert node.read_bytes() == file_before


def test_assert_fails_with_one_line_naming_the_gpu(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, "2xH100-SXM5-80GB")
    config = tmp_path / "c.yaml"
    config.write_text(default_mig_parted_config([CATALOG["H100-SXM5-80GB"]]).to_yaml())
    apply(backend, load_mig_parted_config(config), "all-balanced")
    backend.destroy_mig_device(1, read_state(backend).instances(1)[0].gi_id)
    result = CliRunner().invoke(app, ["mig-parted", "assert", "-f", str(config), "-c", "all-balanced",
                                      "--gpu-backend", f"sim:{node}"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "GPU 1: has " in lines[0] and "GPU 0" not in lines[0]


def test_export_round_trips_through_assert(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    backend = SimulatedBackend.create(node, "3xH100-SXM5-80GB,1xL4")
    config = load_inline({"mix": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb+me": 1, "3g.40gb": 1, "1g.20gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
        {"devices": [2], "mig-enabled": False},
    ]})
    apply(backend, config, "mix")
    result = CliRunner().invoke(app, ["mig-parted", "export", "--gpu-backend", f"sim:{node}", "-o",
                                      str(tmp_path / "exported.yaml")])
    assert result.exit_code == 0, result.output
    exported = load_mig_parted_config(tmp_path / "exported.yaml")
    assert assert_mismatches(exported, "current", read_state(backend)) == []
    document = export_config(read_state(backend))
    assert document["mig-configs"]["current"][2] == {"devices": [2], "mig-enabled": False}
    assert not any("device-filter" in e for e in document["mig-configs"]["current"])  # one MIG model


def assert_one_error_line(output: str, *words: str) -> None:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_pending_mode_change_is_cancelled_by_asking_for_the_current_mode() -> None:
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB")
    config = default_mig_parted_config([CATALOG["A100-SXM4-80GB"]])
    backend.add_process(0, pid=5, used_memory_mib=10)
    outcome = execute(plan_apply(config, "all-balanced", read_state(backend), force=True), backend)
    assert outcome.pending_reset == [0]
    pending = ["GPU 0: MIG is pending, expected disabled"]
    assert assert_mismatches(config, "all-disabled", read_state(backend)) == pending
    execute(plan_apply(config, "all-disabled", read_state(backend), force=True), backend)
    assert assert_mismatches(config, "all-disabled", read_state(backend)) == []
