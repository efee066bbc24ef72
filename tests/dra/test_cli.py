"""`kubegpu dra allocate` and `kubegpu dra slices` end to end through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from kubegpu.cli import build_app
from kubegpu.gpu.simulated import SimulatedBackend
from tests.dra.builders import claim, first_available, request

app = build_app(("kubegpu.dra.cli",))
runner = CliRunner()


def node_file(tmp_path: Path, gpus: str = "1xH100-SXM5-80GB,1xL4") -> Path:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus=gpus, node_name="node-a")
    return path


def slices_file(tmp_path: Path, *extra: str) -> Path:
    result = runner.invoke(app, ["dra", "slices", "--gpu-backend", f"sim:{node_file(tmp_path)}", "--node-name",
                                 "node-a", *extra, "-o", "json"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "slices.json"
    path.write_text(result.stdout)
    return path


def write_yaml(path: Path, objects: list[dict[str, Any]], as_list: bool = False) -> Path:
    if as_list:
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    else:
        path.write_text(yaml.safe_dump_all(objects))
    return path


def test_allocate_with_shipped_classes_exact_output(tmp_path: Path) -> None:
    slices = slices_file(tmp_path, "--dynamic-mig")
    one_g = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    h100 = "device.attributes['gpu.nvidia.com'].productName.contains('H100')"
    claims = write_yaml(tmp_path / "claims.yaml", [
        claim("small", request("mig", "mig.nvidia.com", selectors=(one_g,)), namespace="ml"),
        claim("full", first_available("gpu", request("h100", selectors=(h100,)), request("any")), namespace="ml"),
        claim("more", request("gpu", count=2), namespace="ml"),
    ], as_list=True)
    result = runner.invoke(app, ["dra", "allocate", "--slices", str(slices), "--claims", str(claims), "-o", "json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer == {
        # first fit packs 1g instances from the top memory slot (6) down
        "ml/small": {"results": [{"request": "mig", "driver": "gpu.nvidia.com", "pool": "node-a",
                                  "device": "gpu-0-mig-1g10gb-19-6"}]},
        # the H100 is partly cut, so the whole-GPU device's counters are gone: falls back to the L4
        "ml/full": {"results": [{"request": "gpu/any", "driver": "gpu.nvidia.com", "pool": "node-a",
                                 "device": "gpu-1"}]},
        "ml/more": {"unschedulable": answer["ml/more"]["unschedulable"]},
    }
    assert "'gpu'" in answer["ml/more"]["unschedulable"]


L4 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'"


def test_allocate_with_own_classes_file(tmp_path: Path) -> None:
    slices = slices_file(tmp_path)
    classes = write_yaml(tmp_path / "classes.yaml", [{
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "l4"},
        "spec": {"selectors": [{"cel": {"expression": L4}}]},
    }])
    claims = write_yaml(tmp_path / "claims.yaml", [claim("c", request("g", "l4"))])
    result = runner.invoke(app, ["dra", "allocate", "--slices", str(slices), "--claims", str(claims), "--classes",
                                 str(classes)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["default/c"]["results"][0]["device"] == "gpu-1"


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    slices = slices_file(tmp_path)
    bad_cel = write_yaml(tmp_path / "badcel.yaml", [claim("c", request("g", selectors=("device.driver ==",)))])
    bad_kind = write_yaml(tmp_path / "badkind.yaml", [{"kind": "ResourceClaim", "metadata": {"name": "x"},
                                                      "spec": {"devices": {"requests": [{"name": "g"}]}}}])
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("a: [1,\n")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    cases = [
        (bad_cel, f"{bad_cel}: ResourceClaim default/c: spec.devices.requests[0].exactly.selectors[0].cel.expression"),
        (bad_kind, f"{bad_kind}: ResourceClaim default/x: spec.devices.requests[0]: exactly one of exactly"),
        (not_yaml, f"{not_yaml}"),
        (scalar, f"{scalar}: document 1: expected an object"),
    ]
    for path, message in cases:
        result = runner.invoke(app, ["dra", "allocate", "--slices", str(slices), "--claims", str(path)])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.output
    result = runner.invoke(app, ["dra", "allocate", "--slices", str(slices), "--claims", str(bad_cel), "-o", "xml"])
    assert result.exit_code == 2


def test_slices_yaml_is_multi_document(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dra", "slices", "--gpu-backend", f"sim:{node_file(tmp_path)}", "--node-name",
                                 "node-a", "--dynamic-mig"])
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == ["ResourceSlice"] * len(documents)
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in documents} == {len(documents)}
    assert "sharedCounters" in documents[0]["spec"]  # split layout: the counter sets come first


def test_dra_driver_bad_flags_are_one_line(tmp_path: Path) -> None:
    node = node_file(tmp_path)
    for extra, message in [(["--slice-layout", "tall"], "'--slice-layout': 'tall' is not one of split, combined"),
                           (["--health-interval", "0"], "'--health-interval': must be more than 0")]:
        result = runner.invoke(app, ["dra-driver", "--gpu-backend", f"sim:{node}", "--node-name", "node-a", *extra])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and message in lines[0]


def test_validate_config_knows_dra_objects(tmp_path: Path) -> None:
    full = build_app()
    good = tmp_path / "claim.yaml"
    good.write_text(yaml.safe_dump(claim("c", request("g"))))
    result = runner.invoke(full, ["validate-config", str(good)])
    assert result.exit_code == 0, result.output
    assert "ResourceClaim" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(claim("c", request("g", selectors=("device.driver ==",)))))
    result = runner.invoke(full, ["validate-config", str(bad)])
    assert result.exit_code == 1
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in result.output


def test_fractional_slices_and_shares_through_the_cli(tmp_path: Path) -> None:
    """`dra slices --fractional` publishes shared GPUs; `dra allocate` packs shares onto them and prints each share's
    consumedCapacity and shareID."""
    slices = slices_file(tmp_path, "--fractional")
    share = {"name": "gpu", "exactly": {"deviceClassName": "fraction.gpu.kubegpu.io",
                                        "capacity": {"requests": {"compute": "600"}}}}
    claims = write_yaml(tmp_path / "claims.yaml", [claim(f"c{i}", share) for i in range(3)])
    result = runner.invoke(app, ["dra", "allocate", "--slices", str(slices), "--claims", str(claims)])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    placed = [answer[f"default/c{i}"]["results"][0] for i in range(2)]
    assert [(r["device"], r["consumedCapacity"]["compute"]) for r in placed] == [("gpu-0", "600"), ("gpu-1", "600")]
    assert all(r["shareID"] for r in placed)
    assert "unschedulable" in answer["default/c2"]  # 400 left on each GPU
