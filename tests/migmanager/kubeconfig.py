"""A kubeconfig file for the emulated API server, so CLI commands (which build their own client) can reach it."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(directory: Path, url: str) -> Path:
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "kubegpu-test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "emulated", "user": "tester"}}],
    }))
    return path
