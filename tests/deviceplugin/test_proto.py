"""The committed generated code matches api.proto, and the wire names are the kubelet's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from grpc_tools import protoc

from kubegpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from kubegpu.proto.deviceplugin.v1beta1 import api_pb2_grpc

SRC = Path(__file__).resolve().parents[2] / "src"
PROTOS = sorted(str(p.relative_to(SRC)) for p in (SRC / "kubegpu" / "proto").rglob("*.proto"))


@pytest.mark.parametrize("proto", PROTOS)
def test_generated_code_is_up_to_date(tmp_path: Path, proto: str) -> None:
    target = tmp_path / proto
    target.parent.mkdir(parents=True)
    shutil.copy(SRC / proto, target)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(target)]
    assert protoc.main(args) == 0
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        fresh = (target.parent / name).read_text()
        committed = (SRC / proto).with_name(name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen_protos.sh"


def test_package_and_method_paths_are_the_kubelets() -> None:
    assert pb.DESCRIPTOR.package == "v1beta1"
    service = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [m.name for m in service.methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    assert pb.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    assert "/v1beta1.DevicePlugin/Allocate" in Path(api_pb2_grpc.__file__).read_text()
