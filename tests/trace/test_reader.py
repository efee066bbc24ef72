"""Reading Alibaba's GPU trace: the published columns, compressed samples, and one-line errors for bad rows."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kubegpu.errors import ConfigError
from kubegpu.scheduling.placement import Request
from kubegpu.sim.trace.reader import read_nodes, read_pods

DATA = Path(__file__).parent / "data"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time," \
             "scheduled_time\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_vendored_node_list_is_the_published_cluster() -> None:
    state = read_nodes(DATA / "openb_node_list_gpu_node.csv.gz")
    assert len(state) == 1213 and state.total_gpu_milli == 6212 * 1000
    assert state.model_names == ["A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"]


def test_pods_become_requests_with_shares_whole_gpus_and_models(tmp_path: Path) -> None:
    path = _write(tmp_path, "pods.csv", POD_HEADER
                  + "p0,12000,16384,1,460,,LS,Running,0,1,0\n"
                  + "p1,8000,8192,4,1000,V100M16|V100M32,LS,Running,0,1,\n"
                  + "p2,4000,1024,0,0,,BE,Running,0,1,0\n")
    tasks = read_pods(path)
    assert [t.name for t in tasks] == ["p0", "p1", "p2"]
    assert tasks[0].request == Request(12000, 16384, 1, 460)
    assert tasks[1].request == Request(8000, 8192, 4, 1000, frozenset({"V100M16", "V100M32"}))
    assert tasks[2].request == Request(4000, 1024)


def test_the_multigpu_variants_have_no_gpu_spec_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,8,1000\n")
    assert read_pods(path)[0].request == Request(1000, 10, 8, 1000)


def test_compressed_sample_reads_like_plain_csv() -> None:
    tasks = read_pods(DATA / "openb_pod_list_gpuspec33_sample.csv.gz")
    assert len(tasks) == 510
    assert any(t.request.models for t in tasks) and any(t.request.shares for t in tasks)


@pytest.mark.parametrize(("row", "where"), [
    ("p0,12x,16384,1,460,,LS,Running,0,1,0", "pods.csv:3: column cpu_milli: '12x' is not an integer"),
    ("p0,1000,16384,1,1460,,LS,Running,0,1,0", "pods.csv:3: column gpu_milli: 1460 is out of range"),
    ("p0,1000,16384,2,500,,LS,Running,0,1,0", "pods.csv:3: column gpu_milli: 500 on a task with num_gpu 2"),
    ("p0,1000,16384,0,500,,LS,Running,0,1,0", "pods.csv:3: column gpu_milli: 500 on a task with num_gpu 0"),
    ("p0,-5,16384,0,0,,LS,Running,0,1,0", "pods.csv:3: column cpu_milli: -5 is out of range"),
    (",1000,16384,0,0,,LS,Running,0,1,0", "pods.csv:3: column name: empty"),
    ("p0,1000,16384", "pods.csv:3: has 11 columns in the header but a different number"),
])
def test_bad_pod_rows_name_file_line_and_column(tmp_path: Path, row: str, where: str) -> None:
    path = _write(tmp_path, "pods.csv", POD_HEADER + "ok,1000,1,0,0,,LS,Running,0,1,0\n" + row + "\n")
    with pytest.raises(ConfigError) as caught:
        read_pods(path)
    message = str(caught.value)
    assert where in message and "\n" not in message


def test_bad_node_rows_and_files(tmp_path: Path) -> None:
    header = "sn,cpu_milli,memory_mib,gpu,model\n"
    with pytest.raises(ConfigError, match=r"nodes.csv:3: column sn: 'n0' repeats"):
        read_nodes(_write(tmp_path, "nodes.csv", header + "n0,1000,1,1,T4\nn0,1000,1,1,T4\n"))
    with pytest.raises(ConfigError, match=r"nodes.csv:2: column model: empty on a node with 2 GPU"):
        read_nodes(_write(tmp_path, "nodes.csv", header + "n0,1000,1,2,\n"))
    with pytest.raises(ConfigError, match=r"nodes.csv:1: missing column\(s\) model"):
        read_nodes(_write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n"))
    with pytest.raises(ConfigError, match=r"nodes\.csv: no rows"):
        read_nodes(_write(tmp_path, "nodes.csv", header))
    broken = tmp_path / "nodes.csv.gz"
    broken.write_bytes(gzip.compress(b"sn,cpu_milli\n")[:10])
    with pytest.raises(ConfigError, match=r"nodes\.csv\.gz: cannot read"):
        read_nodes(broken)
    with pytest.raises(ConfigError, match=r"missing\.csv: cannot read"):
        read_nodes(tmp_path / "missing.csv")
