"""The real node's pure parts, without root or binaries: the configuration it writes and why it cannot start."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from kubegpu.testing import nodebuild, realnode
from kubegpu.testing.nodeconfig import NODE_IP, NodePaths, cni_conflist, containerd_config, kubelet_args, kubelet_config


def test_containerd_config_keeps_everything_under_the_node_directory(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    config = tomllib.loads(containerd_config(paths, Path("/bin/runc")))
    assert config["version"] == 3
    for key in ("root", "state"):
        assert Path(config[key]).is_relative_to(tmp_path)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # root here may not lower oom_score_adj
    assert runtime["netns_mounts_under_state_dir"] is True
    assert str(paths.cdi_dir) in runtime["cdi_spec_dirs"] and "/var/run/cdi" in runtime["cdi_spec_dirs"]
    options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert options["BinaryName"] == "/bin/runc" and Path(options["Root"]).is_relative_to(tmp_path)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10"


def test_kubelet_config_and_flags(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path)
    config = yaml.safe_load(kubelet_config(paths, tmp_path / "ca.crt", 10250, 10248, ["DRAConsumableCapacity"]))
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["address"] == NODE_IP and config["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert config["imageGCHighThresholdPercent"] == 100  # the imported test image must never be collected
    assert config["featureGates"] == {"DRAConsumableCapacity": True}
    args = kubelet_args(paths, tmp_path / "kubeconfig")
    assert f"--root-dir={tmp_path / 'kubelet'}" in args and "--hostname-override=real-node-0" in args
    conflist = json.loads(cni_conflist(paths))
    assert [p["type"] for p in conflist["plugins"]] == ["bridge", "loopback"]
    assert conflist["plugins"][0]["ipMasq"] is False  # no iptables


def test_without_root_the_reason_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    reason = realnode.unavailable_reason()
    assert reason is not None and "needs root" in reason and "\n" not in reason


def test_missing_binaries_name_the_build_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reason = realnode.unavailable_reason()
    assert reason is not None and "scripts/control-plane.sh build" in reason and "kubelet" in reason
    assert nodebuild.missing() == [*nodebuild.BINARIES, *nodebuild.IMAGES]
