"""Issue #18: state files other processes trust carry a checksum; a torn, tampered or foreign file is detected.

One block per file. Each has a test of the corruption the reader accepted before the checksum existed (a flipped
digit read as a different slice size, a node file with a changed field, a label file cut at a line boundary, a
limits record with a changed limit), a test that the format written before is still read, and a test of what the
reader does about it: rebuild from the source of truth (slices: the plan on the Node; labels: the discovery pass)
with one log line, or one error line naming the file (the `sim:` node file, which has no other source).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.discovery.agent import FeatureFileSink
from kubegpu.discovery.labels import parse_features_file
from kubegpu.errors import ConfigError
from kubegpu.files import CorruptStateError, dumps_checked
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube import MemoryCluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.agent import PartitionAgent
from kubegpu.sharing.mps import MpsPlan, dumps_limits, limits_document, parse_limits, read_slices, write_slices
from kubegpu.sharing.mps_control import MpsControl
from kubegpu.statefiles import dumps_stamped, stamp_checksum, verify_checksum

# ---------------------------------------------------------------------------------------------- MPS slices


def test_slices_with_a_flipped_digit_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "slices.json"
    write_slices(path, {0: [20, 20, 40], 1: [10]})
    assert read_slices(path) == {0: [20, 20, 40], 1: [10]}
    path.write_text(path.read_text().replace("40", "48"))  # the old plain file read this as a 48 GB slice
    with pytest.raises(CorruptStateError, match=rf"^{path}: kubegpu-mps-slices state checksum mismatch"):
        read_slices(path)


@pytest.mark.parametrize("text", ['{"0": [20, 2', '{"kind": "kubegpu-dra-checkpoint", "version": 1}', "[1, 2]",
                                  '{"0": [20, -5]}', '{"0": [true]}', '{"gpu": [20]}', '{"0": [1e400]}'])
def test_torn_or_foreign_slices_files_are_corrupt_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "slices.json"
    path.write_text(text)
    with pytest.raises(CorruptStateError) as caught:
        read_slices(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_slices_written_before_the_checksum_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "slices.json"
    path.write_text('{"0": [20, 20, 40], "1": [10]}')
    assert read_slices(path) == {0: [20, 20, 40], 1: [10]}
    assert read_slices(tmp_path / "missing.json") == {}


def test_slices_envelope_sorts_gpu_indexes_as_the_reader_does(tmp_path: Path) -> None:
    path = tmp_path / "slices.json"
    write_slices(path, {i: [10] for i in range(12)})  # "10" < "2" as strings: the checksum must not care
    assert read_slices(path) == {i: [10] for i in range(12)}


def test_partition_agent_rebuilds_a_tampered_slices_file_from_the_plan(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock(0)
    cluster = MemoryCluster(clock)
    backend = SimulatedBackend.create(None, "1xA100-SXM4-80GB", node_name="m", clock=clock)
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "m", "labels": {ann.PARTITIONING_LABEL: "mps"},
        "annotations": {ann.SPEC_PLAN: "1", "kubegpu.io/spec-gpu-0-layout": "20gb,40gb"}}})
    slices = tmp_path / "slices.json"
    agent = PartitionAgent(cluster, backend, "m", slices)
    agent.tick()
    assert read_slices(slices) == {0: [20, 40]}
    slices.write_text(slices.read_text().replace("40", "70"))
    with caplog.at_level(logging.WARNING, logger="kubegpu.partition-agent"):
        agent.tick()  # the plan is already applied: the report pass finds the file corrupt and rebuilds it
    assert read_slices(slices) == {0: [20, 40]}
    assert [r.getMessage() for r in caplog.records] == [
        f"{slices}: kubegpu-mps-slices state checksum mismatch; rebuilt it from the plan on Node m (1 GPUs)"]
    status = cluster.get("Node", "m")["metadata"]["annotations"]
    assert status["kubegpu.io/status-gpu-0-40gb-free"] == "1" and "kubegpu.io/status-gpu-0-70gb-free" not in status


# ---------------------------------------------------------------------------------------------- sim node file


def _node(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    SimulatedBackend.create(path, gpus="2xA100-SXM4-80GB")
    return path


def test_sim_node_file_with_a_changed_field_is_one_error_line(tmp_path: Path) -> None:
    path = _node(tmp_path)
    path.write_text(path.read_text().replace('"mig_enabled":false', '"mig_enabled":true', 1))  # accepted before
    with pytest.raises(CorruptStateError) as caught:
        SimulatedBackend(path).devices()
    message = str(caught.value)
    assert message.startswith(f"{path}: simulated node file checksum mismatch") and "\n" not in message
    assert "delete its 'sha256' field" in message


def test_torn_sim_node_file_is_one_error_line(tmp_path: Path) -> None:
    path = _node(tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=rf"^{path}:"):
        SimulatedBackend(path).devices()


def test_empty_sim_node_file_is_one_error_line_not_a_traceback(tmp_path: Path) -> None:
    """Found by benchmarks/fuzz.py (sim-node:549): a 0-byte file matched the 'bytes already validated' cache's
    initial value and went to json.loads unchecked (JSONDecodeError)."""
    path = tmp_path / "node.json"
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"^{path}:1:1: invalid JSON"):
        SimulatedBackend(path).devices()


def test_sim_node_file_without_a_checksum_is_hand_written_and_accepted(tmp_path: Path) -> None:
    path = _node(tmp_path)
    state = json.loads(path.read_text())
    assert len(state.pop("sha256")) == 64
    state["gpus"][1]["mig_enabled"] = True
    path.write_text(json.dumps(state, indent=4))
    backend = SimulatedBackend(path)
    assert [d.mig_enabled for d in backend.devices()] == [False, True]
    assert "sha256" not in backend.snapshot()
    backend.set_load(0, 50.0, 100)  # the next write stamps it again
    assert len(json.loads(path.read_text())["sha256"]) == 64


def test_a_reformatted_sim_node_file_keeps_its_checksum(tmp_path: Path) -> None:
    path = _node(tmp_path)
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))  # the hash is over content, not layout
    assert len(SimulatedBackend(path).devices()) == 2


# ---------------------------------------------------------------------------------------------- NFD label file


def test_label_file_cut_at_a_line_boundary_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    FeatureFileSink(path).write({"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "A100", "z": "1"})
    text = path.read_text()
    assert parse_features_file(text, str(path)) == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "A100",
                                                    "z": "1"}
    torn = text[: text.index("z=1")]  # whole lines only: NFD, and a plain reader, took this for the label set
    with pytest.raises(CorruptStateError, match=rf"^{path}: NFD feature file checksum mismatch"):
        parse_features_file(torn, str(path))


def test_label_file_checksum_line_is_a_plain_nfd_comment(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    FeatureFileSink(path).write({"a": "1"})
    first, *rest = path.read_text().splitlines()
    assert first.startswith("# kubegpu-sha256=") and not first.startswith("# +")  # `# +` is an NFD directive
    assert rest == ["a=1"]


def test_hand_written_label_file_is_read_as_nfd_does() -> None:
    text = "# a comment\n  a=1 \nflag\n\nb=x=y\n"
    assert parse_features_file(text, "gfd") == {"a": "1", "flag": "true", "b": "x=y"}


def test_discovery_rewrites_a_corrupt_label_file_and_leaves_a_whole_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gfd"
    sink = FeatureFileSink(path)
    sink.write({"a": "1", "b": "2"})
    inode = path.stat().st_ino
    sink.write({"a": "1", "b": "2"})
    assert path.stat().st_ino == inode  # unchanged labels: no rewrite, so NFD sees no change event
    path.write_text(path.read_text().replace("b=2", "b=3"))
    with caplog.at_level(logging.WARNING, logger="kubegpu.discovery"):
        sink.write({"a": "1", "b": "2"})
    assert parse_features_file(path.read_text(), str(path)) == {"a": "1", "b": "2"}
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: NFD feature file checksum mismatch: the file is torn or was changed after it was written (after a "
        "hand edit, delete its first line); rewriting it from this discovery pass"]


# ---------------------------------------------------------------------------------------------- MPS limits record


def _plans() -> list[MpsPlan]:
    from kubegpu.sharing.mps import GpuLimits

    return [MpsPlan("nvidia.com/gpu", "/run/mps/pipe", "/run/mps/log", (GpuLimits(0, "GPU-0", 3, 27306, 33),))]


def test_limits_record_with_a_changed_limit_is_refused(tmp_path: Path) -> None:
    path = MpsControl(tmp_path, None).record(_plans())
    record = parse_limits(path.read_text(), str(path))
    assert record["daemons"] == limits_document(_plans())["daemons"]  # readers of `daemons` see what they saw
    path.write_text(path.read_text().replace("27306", "97306"))  # a plain JSON reader took this
    with pytest.raises(CorruptStateError, match=rf"^{path}: MPS limits record checksum mismatch"):
        parse_limits(path.read_text(), str(path))


@pytest.mark.parametrize("text", ['{"daemons": [', '{"kind": "kubegpu-sim-node", "daemons": []}', '{"x": 1}'])
def test_torn_or_foreign_limits_records_are_corrupt(text: str) -> None:
    with pytest.raises(CorruptStateError, match=r"^limits\.json: "):
        parse_limits(text, "limits.json")


def test_limits_record_written_before_the_checksum_is_still_read() -> None:
    old = json.dumps(limits_document(_plans()), indent=2)
    assert parse_limits(old, "limits.json")["daemons"][0]["resource"] == "nvidia.com/gpu"
    assert parse_limits(dumps_limits(_plans()), "limits.json")["kind"] == "kubegpu-mps-limits"


# ---------------------------------------------------------------------------------------------- the helpers


def test_stamped_documents_verify_and_int_keys_are_hashed_as_read() -> None:
    document = {"kind": "k", "by_gpu": {2: "a", 10: "b"}}
    stamped = json.loads(json.dumps(stamp_checksum(document)))
    assert verify_checksum(stamped, "f.json", "test") is True and "sha256" not in stamped
    compact = json.loads(dumps_stamped({"kind": "k", "n": [1, 2.5]}))
    assert verify_checksum(compact, "f.json", "test") is True
    assert verify_checksum({"kind": "k"}, "f.json", "test") is False  # no field: hand-written
    assert dumps_stamped({}) == json.dumps(stamp_checksum({}), separators=(",", ":"))


def test_envelope_and_stamp_are_not_confused(tmp_path: Path) -> None:
    path = tmp_path / "slices.json"
    path.write_text(dumps_checked("kubegpu-mps-slices", 2, {"0": [20]}))  # a future version: not guessed at
    with pytest.raises(CorruptStateError, match="version 2, expected 1"):
        read_slices(path)
