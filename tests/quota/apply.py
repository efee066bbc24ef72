"""Apply and remove `deploy/kubernetes/quota/` on the real control plane (test helper)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import lightkube
import yaml
from lightkube import codecs
from lightkube.generic_resource import create_namespaced_resource

from kubegpu.quota.manifests import REPO_DIR

create_namespaced_resource("kubegpu.io", "v1", "ElasticQuota", "elasticquotas")
FIELD_MANAGER = "kubegpu-test"
T = TypeVar("T")


def shipped(names: tuple[str, ...] = ("00", "10", "20", "30", "40")) -> list[dict[str, Any]]:
    """The objects of the shipped files whose names start with `names`, in file-name order."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(REPO_DIR).glob("*.yaml")):
        if path.name.startswith(names):
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def apply_all(client: lightkube.Client, objects: list[dict[str, Any]]) -> list[Any]:
    applied = []
    for data in objects:
        obj = codecs.from_dict(data)
        client.apply(obj, field_manager=FIELD_MANAGER, force=True)
        applied.append(obj)
    return applied


def remove_all(client: lightkube.Client, applied: list[Any], keep_kinds: tuple[str, ...] = ("Namespace",)) -> None:
    for obj in reversed(applied):
        if obj.kind in keep_kinds:
            continue
        with contextlib.suppress(lightkube.ApiError):
            client.delete(type(obj), obj.metadata.name, namespace=getattr(obj.metadata, "namespace", None))


def until_admitted(create: Callable[[], T]) -> T | None:
    """`create()`, or None while the API server refuses it: policies just applied become active one by one (the
    table guard may refuse a GPU pod before the charge policy sees its table), so a wait retries a refusal too."""
    try:
        return create()
    except lightkube.ApiError:
        return None
