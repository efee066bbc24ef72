"""Exact label sets for simulated nodes, compared with expected files written by hand from the reference.

Each case runs the whole path a real node runs: a mig-parted layout applied through the MIG manager's planner, the
backend read, the labels computed, the NFD features file written, and the file read back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.discovery.agent import FeatureFileSink, discover_labels
from kubegpu.discovery.labels import parse_features_file

from .conftest import NOW, plugin_config, read_golden, sim_node

TIME_SLICING_X4 = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
TIME_SLICING_RENAMED = {
    "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
}

CASES = [
    ("a100-mixed-all-balanced.labels", "8xA100-SXM4-80GB", "all-balanced", {"flags": {"migStrategy": "mixed"}},
     "NVIDIA DGX A100"),
    ("h100-time-slicing-x4.labels", "8xH100-SXM5-80GB", None, TIME_SLICING_X4, "NVIDIA DGX H100"),
    ("h100-time-slicing-rename.labels", "8xH100-SXM5-80GB", None, TIME_SLICING_RENAMED, "NVIDIA DGX H100"),
    ("l4-no-mig.labels", "4xL4", None, {}, None),
    ("a100-40-single-3g.labels", "2xA100-SXM4-40GB", "all-3g.20gb", {"flags": {"migStrategy": "single"}},
     "NVIDIA DGX A100"),
]


@pytest.mark.parametrize(("golden", "gpus", "layout", "config", "machine"), CASES, ids=[c[0] for c in CASES])
def test_label_set_matches_expected_file(
    golden: str, gpus: str, layout: str | None, config: dict[str, object], machine: str | None, tmp_path: Path
) -> None:
    backend = sim_node(gpus, layout)
    labels = discover_labels(backend, plugin_config(config), machine, NOW)
    sink = FeatureFileSink(tmp_path / "gfd")
    sink.write(labels)
    written = parse_features_file((tmp_path / "gfd").read_text(), "gfd")
    expected = read_golden(golden)
    assert written == expected, {
        "missing": sorted(expected.keys() - written.keys()),
        "unexpected": sorted(written.keys() - expected.keys()),
        "different": {k: (v, expected[k]) for k, v in written.items() if k in expected and v != expected[k]},
    }
