"""Fixtures for the end-to-end tests against the real control plane (`real_cluster` lives in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubegpu.testing.session import RealCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((ROOT / "deploy" / "crds").glob("*.yaml"))


@pytest.fixture(scope="session")
def crds(real_cluster: RealCluster) -> list[str]:
    """Every CRD under deploy/crds, installed (server-side apply) and Established; their names."""
    from kubegpu.testing.session import install_crds

    return install_crds(real_cluster, CRD_FILES)
