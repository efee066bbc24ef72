"""The real-node tier (docs/testing.md): every test here runs on the session's real kubelet (`real_node` fixture in
tests/conftest.py, marker `kubelet`) with kubegpu's node agents started as processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.testing.nodepods import NodeSession


@pytest.fixture
def node_ns(real_node: NodeSession, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test's pods, deleted afterwards (its pods go with it)."""
    name = real_node.real.create_namespace(request.node.name)
    yield name
    real_node.real.delete_namespace(name)
