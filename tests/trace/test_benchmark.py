"""benchmarks/fragmentation.py's pieces that need neither the artifact's build nor the full trace: reading FGD's
log, writing its pod input, and the comparison against the published table on the vendored sample."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks import fragmentation as bench

DATA = Path(__file__).parent / "data"


def test_the_artifacts_alloc_lines_give_the_same_levels_as_the_replay() -> None:
    lines = [f'time="t" level=info msg="[Alloc]; Used nodes: 1; Used GPUs: 1; Used GPU Milli: {used}; '
             f'Total GPUs: 2; Arrived GPU Milli: {arrived}\\n"' for used, arrived in ((700, 700), (1400, 1400),
                                                                                    (1400, 2100))]
    levels = bench.allocation_levels("\n".join(["noise", *lines]))
    assert len(levels) == 131
    assert levels[0] == levels[35] == 35.0 and levels[36] == levels[70] == 70.0
    assert levels[105] == 70.0 and levels[130] == 70.0
    with pytest.raises(bench.KubegpuError, match="no '\\[Alloc\\]"):
        bench.allocation_levels("nothing here")


def test_pod_input_carries_requests_and_gpu_annotations(tmp_path: Path) -> None:
    sample = gzip.decompress((DATA / "openb_pod_list_gpuspec33_sample.csv.gz").read_bytes())
    (tmp_path / "openb_pod_list_sample.csv").write_bytes(sample)
    documents = [json.loads(d) for d in bench._pod_yaml(tmp_path, "sample").split("\n---\n")]
    assert len(documents) == 510
    pinned = next(d for d in documents if "alibabacloud.com/gpu-card-model" in d["metadata"].get("annotations", {}))
    annotations = pinned["metadata"]["annotations"]
    assert int(annotations["alibabacloud.com/gpu-count"]) >= 1 and int(annotations["alibabacloud.com/gpu-milli"]) > 0
    assert pinned["spec"]["containers"][0]["resources"]["requests"]["cpu"].endswith("m")


def test_published_table_and_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert len(bench.PUBLISHED) == 17 and bench.PUBLISHED["default"][-1] == 95.23
    assert bench._seeds("42-44,50") == [42, 43, 44, 50]
    assert bench.main(["--trace-dir", str(tmp_path)]) == 1
    assert f"--trace-dir {tmp_path}: no openb_node_list_gpu_node.csv" in capsys.readouterr().err


def _trace(tmp_path: Path, gpu_milli: int) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,65536,4,T4\n")
    (tmp_path / "openb_pod_list_one.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"p{i},1000,1024,1,{gpu_milli}\n" for i in range(3)))
    return tmp_path


def test_share_packing_charges_the_leftover_no_share_can_use(tmp_path: Path) -> None:
    # 4 GPUs; shares of 810 arrive until 4,050 thousandths: five GPUs' worth of leftovers of 190 that nothing fits
    assert bench.share_packing(_trace(tmp_path, 810), "one", 42) == (76.25, 76.25)
    # quarters pack exactly: nothing is left over
    assert bench.share_packing(_trace(tmp_path, 250), "one", 42) == (100.0, 100.0)
