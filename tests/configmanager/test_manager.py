"""The config-manager over an in-memory API: the link follows the Node's label; a bad label keeps what runs."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kubegpu.cli import app
from kubegpu.configmanager.manager import ConfigManager, Settings, link_config
from kubegpu.configmanager.select import EMPTY
from kubegpu.errors import ConfigError
from kubegpu.kube.memory import MemoryCluster

LABEL = "nvidia.com/device-plugin.config"


def configmap_dir(root: Path) -> Path:
    """A directory shaped like a mounted ConfigMap volume: `..data` → timestamped dir, each key a link into it."""
    data = root / "available" / "..2026_11_27_03_00_00.000000001"
    data.mkdir(parents=True)
    for key, text in {"whole": "version: v1\n", "ts-2": "version: v1\n# 2\n", "ts-4": "version: v1\n# 4\n"}.items():
        (data / key).write_text(text)
    os.symlink(data.name, root / "available" / "..data")
    for key in ("whole", "ts-2", "ts-4"):
        os.symlink(f"..data/{key}", root / "available" / key)
    return root / "available"


@pytest.fixture
def cluster() -> MemoryCluster:
    api = MemoryCluster()
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}}})
    return api


def label(cluster: MemoryCluster, value: str | None) -> None:
    cluster.patch("Node", "n1", {"metadata": {"labels": {LABEL: value}}})


def manager(cluster: MemoryCluster, tmp_path: Path, default: str = "whole") -> ConfigManager:
    return ConfigManager(cluster, Settings("n1", configmap_dir(tmp_path), tmp_path / "config" / "config.yaml",
                                           default=default, fallbacks=("empty",)))


def test_oneshot_links_the_default_then_the_labelled_config(cluster: MemoryCluster, tmp_path: Path) -> None:
    m = manager(cluster, tmp_path)
    assert m.once().name == "whole"
    dst = tmp_path / "config" / "config.yaml"
    assert os.readlink(dst) == str(tmp_path / "available" / "whole") and dst.read_text() == "version: v1\n"
    label(cluster, "ts-4")
    assert m.once().name == "ts-4" and dst.read_text().endswith("# 4\n")
    assert link_config(tmp_path / "available", "ts-4", dst) is False  # already so: no new link, no reload


def test_oneshot_with_a_label_naming_no_config_fails(cluster: MemoryCluster, tmp_path: Path) -> None:
    label(cluster, "ts-8")
    with pytest.raises(ConfigError, match="=ts-8: no such config"):
        manager(cluster, tmp_path).once()
    assert not (tmp_path / "config" / "config.yaml").exists()


def test_the_empty_config_is_an_empty_file(cluster: MemoryCluster, tmp_path: Path) -> None:
    m = manager(cluster, tmp_path, default="")
    assert m.once().name == EMPTY
    assert (tmp_path / "config" / "config.yaml").read_text() == ""


def test_following_the_label_and_keeping_the_config_on_a_bad_one(cluster: MemoryCluster, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    m = manager(cluster, tmp_path)
    dst = tmp_path / "config" / "config.yaml"
    stop = threading.Event()
    thread = threading.Thread(target=m.run, args=(stop,), kwargs={"watch_timeout": 0.5}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: dst.exists() and dst.read_text() == "version: v1\n")
        label(cluster, "ts-2")
        wait_for(lambda: dst.read_text().endswith("# 2\n"))
        caplog.set_level(logging.ERROR, logger="kubegpu.configmanager")
        label(cluster, "nope")
        wait_for(lambda: any("=nope: no such config" in r.getMessage() for r in caplog.records))
        [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert error.endswith("keeping the current config (ts-2)") and "\n" not in error
        assert dst.read_text().endswith("# 2\n")
        label(cluster, None)  # label removed: back to the default
        wait_for(lambda: dst.read_text() == "version: v1\n")
    finally:
        stop.set()
        cluster.patch("Node", "n1", {"metadata": {"annotations": {"wake": "up"}}})  # end the blocked watch
        thread.join(5)
    assert not thread.is_alive()


def test_a_configmap_edit_reaches_the_reader_through_the_link(cluster: MemoryCluster, tmp_path: Path) -> None:
    """The kubelet updates a ConfigMap volume by swapping `..data`; the selected config follows without a new link."""
    m = manager(cluster, tmp_path)
    m.once()
    root = tmp_path / "available"
    fresh = root / "..2026_11_27_04_00_00.000000002"
    fresh.mkdir()
    for key in ("whole", "ts-2", "ts-4"):
        (fresh / key).write_text("version: v1\n# edited\n")
    os.symlink(fresh.name, root / "..tmp")
    os.replace(root / "..tmp", root / "..data")
    assert (tmp_path / "config" / "config.yaml").read_text().endswith("# edited\n")


def test_cli_oneshot_is_one_error_line_for_a_bad_fallback(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["config-manager", "--node-name", "n1", "--config-file-srcdir", str(tmp_path),
                                      "--config-file-dst", str(tmp_path / "c.yaml"), "--oneshot",
                                      "--fallback-strategies", "named,bogus"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --fallback-strategies: unknown strategy 'bogus' (want named, single, empty)"]


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("condition not met in time")
