"""Fixtures shared across components' tests (keep this small)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fakes.apiserver import ApiServer


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    """An emulated Kubernetes API server (kmock + compat) over HTTP, started once per session.

    ``apiserver.cluster()`` gives a LightkubeCluster pointed at it; see tests/fakes/apiserver.py for its limits.
    """
    from tests.fakes.apiserver import start_apiserver  # kmock and lightkube load only for tests that use it

    server = start_apiserver()
    yield server
    server.stop()
