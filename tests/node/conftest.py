"""The real-node tier (docs/testing.md): every test here runs on the session's real kubelet (`real_node` fixture in
tests/conftest.py, marker `kubelet`) with kubegpu's node agents started as processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.testing.nodepods import NodeSession, until


@pytest.fixture
def node_ns(real_node: NodeSession, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test's pods, deleted afterwards — and its pods gone before the next test starts,
    so no test meets devices (or PodResources entries) another one still holds."""
    name = real_node.real.create_namespace(request.node.name)
    yield name
    real_node.real.delete_namespace(name)
    until(lambda: not real_node.cluster.list("Pod", name), f"the pods of namespace {name} gone", timeout=90)
