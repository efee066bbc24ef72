"""Fixtures for the end-to-end tests against the real control plane (`real_cluster` lives in tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightkube
import pytest
import yaml
from lightkube import codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from kubegpu.testing.session import wait_for

if TYPE_CHECKING:
    from kubegpu.testing.session import RealCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((ROOT / "deploy" / "crds").glob("*.yaml"))
SHIPPED_NAMESPACE = "kubegpu"  # the namespace the shipped manifests install into


@pytest.fixture(scope="session")
def crds(real_cluster: RealCluster) -> list[str]:
    """Every CRD under deploy/crds, installed (server-side apply) and Established; their names."""
    from kubegpu.testing.session import install_crds

    return install_crds(real_cluster, CRD_FILES)


def _namespace_ready(admin: lightkube.Client) -> str | None:
    """"created" or "existing" once the namespace takes new objects; None while an earlier test's deletion of it is
    still terminating (the API server refuses new objects there until it is gone)."""
    try:
        admin.create(Namespace(metadata=ObjectMeta(name=SHIPPED_NAMESPACE)))
        return "created"
    except lightkube.ApiError as exc:
        if exc.status.code != 409:
            raise
    current = admin.get(Namespace, SHIPPED_NAMESPACE)
    phase = current.status.phase if current.status else None
    return None if current.metadata.deletionTimestamp is not None or phase == "Terminating" else "existing"


@contextlib.contextmanager
def shipped_objects(real_cluster: RealCluster, docs: list[dict[str, Any]]) -> Iterator[lightkube.Client]:
    """Shipped manifests (`docs`: a component's ServiceAccount and RBAC, a policy) applied in the `kubegpu` namespace,
    made first if need be; deleted again afterwards, with the namespace if this made it. Yields the admin client."""
    admin = real_cluster.client()
    created_namespace = wait_for(lambda: _namespace_ready(admin), f"namespace {SHIPPED_NAMESPACE} usable",
                                 timeout=60) == "created"
    objects = [codecs.from_dict(d) for d in docs]
    for obj in objects:
        admin.apply(obj, field_manager="kubegpu-test", force=True)
    try:
        yield admin
    finally:
        for obj in reversed(objects):
            with contextlib.suppress(lightkube.ApiError):
                admin.delete(type(obj), obj.metadata.name, namespace=obj.metadata.namespace)
        if created_namespace:
            with contextlib.suppress(lightkube.ApiError):
                admin.delete(Namespace, SHIPPED_NAMESPACE)


def token_client(real_cluster: RealCluster, token: str, user: str) -> lightkube.Client:
    """A client of the real API server that authenticates with `token` (a ServiceAccount's) as `user`."""
    config = yaml.safe_load(real_cluster.kubeconfig.read_text())
    config["users"] = [{"name": user, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = user
    return lightkube.Client(config=KubeConfig.from_dict(config), trust_env=False)
