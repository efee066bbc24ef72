"""`kubegpu validate-config`, run in-process: kind detection, exit codes, one line per file, the kind registry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import kubegpu.config as config_pkg
from kubegpu.config import ValidationOptions, register_validator
from kubegpu.errors import ConfigError

DATA = Path(__file__).parent / "data"
EXAMPLES = sorted(DATA.glob("*.yaml"))


def run(app: typer.Typer, *args: str) -> tuple[int, list[str], list[str]]:
    result = CliRunner().invoke(app, ["validate-config", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout.splitlines(), result.stderr.splitlines()


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"dp-full-example.yaml", "dp-nos-mps-slices.yaml", "mig-parted-format-example.yaml",
            "mig-parted-defaults.yaml"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_reference_example_is_valid(cli_app: typer.Typer, example: Path) -> None:
    code, out, err = run(cli_app, str(example))
    assert (code, err) == (0, [])
    kind = "mig-parted config" if example.name.startswith("mig-parted") else "device-plugin config"
    assert len(out) == 1 and out[0].startswith(f"{example}: valid {kind}")


def test_several_files_each_reported_and_any_failure_exits_1(cli_app: typer.Typer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                   "      replicas: 1\n")
    good = DATA / "dp-full-example.yaml"
    code, out, err = run(cli_app, str(good), str(bad), str(DATA / "mig-parted-defaults.yaml"))
    assert code == 1
    assert [line.split(": valid")[0] for line in out] == [str(good), str(DATA / "mig-parted-defaults.yaml")]
    assert err == [f"error: {bad}: sharing.timeSlicing.resources[0].replicas: must be at least 2, got 1"]


NAMED_MALFORMED = {
    "wrong-type.yaml": ("version: v1\nflags:\n  plugin:\n    passDeviceSpecs: 'no'\n",
                        "flags.plugin.passDeviceSpecs: must be a boolean"),
    "replicas-1.yaml": ("version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n",
                        "sharing.mps.resources[0].replicas: must be at least 2, got 1"),
    "mps-mixed.yaml": ("version: v1\nflags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n"
                       "    - {name: nvidia.com/gpu, replicas: 2}\n",
                       "sharing.mps: MPS sharing is not supported with flags.migStrategy mixed"),
    "unknown-key.yaml": ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                         "    - {name: nvidia.com/gpu, replicas: 2, replica: 3}\n",
                         "sharing.timeSlicing.resources[0].replica: unknown field"),
    "bad-version.yaml": ("version: v1beta1\nflags: {}\n", "version: unknown version 'v1beta1' (expected v1)"),
    "unknown-profile.yaml": ('version: v1\nmig-configs:\n  all-x:\n  - device-filter: "0x233510DE"\n'
                             '    devices: all\n    mig-enabled: true\n    mig-devices: {"3g.40gb": 2}\n',
                             'mig-configs.all-x[0].mig-devices["3g.40gb"]: GPU model H200-141GB has no MIG profile'),
    "does-not-fit.yaml": ('version: v1\nmig-configs:\n  all-x:\n  - device-filter: ["0x20B210DE"]\n'
                          '    devices: all\n    mig-enabled: true\n    mig-devices: {"3g.40gb": 2, "2g.20gb": 1}\n',
                          'mig-configs.all-x[0].mig-devices["2g.20gb"]: 1 x 2g.20gb does not fit on A100-SXM4-80GB'),
    "mig-unknown-key.yaml": ("version: v1\nmig-configs:\n  x:\n  - {devices: all, mig-enabled: false, gpus: 2}\n",
                             "mig-configs.x[0].gpus: unknown field"),
    "syntax.yaml": ("version: v1\nflags: {migStrategy: none\n", None),
}


@pytest.mark.parametrize("name", sorted(NAMED_MALFORMED))
def test_named_malformed_files_give_one_line_and_exit_1(cli_app: typer.Typer, tmp_path: Path, name: str) -> None:
    text, expected = NAMED_MALFORMED[name]
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run(cli_app, str(path))
    assert (code, out, len(err)) == (1, [], 1)
    if expected is None:
        assert err[0].startswith(f"error: {path}:3:1: invalid YAML: ")
    else:
        assert err[0].startswith(f"error: {path}: {expected}")


def test_gpu_model_option_selects_models(cli_app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "mig.yaml"
    path.write_text('version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n'
                    '    mig-devices: {"1g.10gb": 7}\n')
    code, out, _ = run(cli_app, str(path))
    assert code == 0 and "A100-SXM4-80GB" in out[0]
    code, out, _ = run(cli_app, str(path), "--gpu-model", "H100-SXM5-80GB", "--gpu-model", "0x20B210DE")
    assert code == 0 and out[0].endswith("layouts checked against A100-SXM4-80GB, H100-SXM5-80GB)")
    code, out, err = run(cli_app, str(path), "--gpu-model", "A100-SXM4-40GB")
    assert code == 1 and "at most 4 fit on A100-SXM4-40GB" in err[0]
    code, out, err = run(cli_app, str(path), "--gpu-model", "Z100")
    assert (code, out) == (1, []) and err == [err[0]] and err[0].startswith("error: --gpu-model: unknown GPU model")


def test_undetectable_and_unreadable_files(cli_app: typer.Typer, tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\n")
    code, _, err = run(cli_app, str(pod), str(tmp_path / "missing.yaml"), str(tmp_path))
    assert code == 1
    assert err[0].startswith(f"error: {pod}: cannot tell what kind of file this is (known kinds: ")
    assert err[1] == f"error: {tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    assert err[2].startswith(f"error: {tmp_path}: cannot read: ")


def test_json_files_are_accepted(cli_app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text('{"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu",'
                    ' "replicas": 10}]}}}')
    assert run(cli_app, str(path))[0] == 0


def test_registered_kinds_extend_detection(
    cli_app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = list(config_pkg.registered_kinds())
    monkeypatch.setattr(config_pkg._REGISTRY, "kinds", kinds)  # restored after the test

    def detect(data: object) -> bool:
        return isinstance(data, dict) and data.get("kind") == "TestWidget"

    def validate(data: object, source: str, options: ValidationOptions) -> str:
        assert isinstance(data, dict)
        if not isinstance(data.get("pods"), int):
            raise ConfigError(f"{source}: pods: must be an integer")
        return f"{data['pods']} pods"

    register_validator("test-widget", detect, validate)
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("kind: TestWidget\npods: 3\n")
    bad.write_text("kind: TestWidget\npods: many\n")
    assert run(cli_app, str(good))[:2] == (0, [f"{good}: valid test-widget (3 pods)"])
    assert run(cli_app, str(bad))[::2] == (1, [f"error: {bad}: pods: must be an integer"])
    assert [k.name for k in config_pkg.registered_kinds()][-1] == "test-widget"
    register_validator("test-widget", detect, lambda data, source, options: "replaced")
    assert run(cli_app, str(good))[1] == [f"{good}: valid test-widget (replaced)"]


def test_help_is_available(cli_app: typer.Typer) -> None:
    result = CliRunner().invoke(cli_app, ["validate-config", "--help"])
    assert result.exit_code == 0 and "--gpu-model" in result.stdout


def test_example_copied_elsewhere_is_reported_with_its_own_path(cli_app: typer.Typer, tmp_path: Path) -> None:
    copy = tmp_path / "copy.yaml"
    shutil.copy(DATA / "dp-full-example.yaml", copy)
    assert run(cli_app, str(copy))[1][0].startswith(f"{copy}: valid device-plugin config")
