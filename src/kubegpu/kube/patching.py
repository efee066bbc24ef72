"""The three patch flavours of the API server, applied to plain-dict objects.

- JSON merge patch (RFC 7386): maps merge recursively, ``null`` deletes a key, lists are replaced whole.
- JSON patch (RFC 6902): through the ``jsonpatch`` library; a failed ``test`` op or a bad path is 422 Invalid.
- Strategic merge patch: a merge patch where the lists Kubernetes declares with a patch merge key are merged item by
  item (containers, env, volumes, volumeMounts, ports by their keys; conditions by type; ownerReferences by uid;
  finalizers as a set), and an item carrying ``"$patch": "delete"`` removes the matching item; a map carrying
  ``"$patch": "replace"`` replaces instead of merging. Lists without a merge key in Kubernetes (tolerations, taints,
  args, command, ...) are replaced, as the API server does.
  Simplifications: ``$setElementOrder``, ``$retainKeys`` and ``$deleteFromPrimitiveList`` directives are not
  supported (they are rejected as Invalid), and merged items keep the original order with new items appended.

And the one way kubegpu's controllers write a list-valued field several writers share (a Node's taints and
finalizers, a NodeClaim's finalizers): `update_lists` adds and removes only kubegpu's own entries and sends the
result with the resourceVersion of the object it was computed from; on 409 Conflict it reads the object again with
a GET at the server (never an informer's copy) and redoes the edit (`kubegpu.kube.retry.update_with_retry`). A
merge patch replaces a list whole, so a list rebuilt from an older copy would silently drop whatever another
controller (the node lifecycle controller's taints, the MIG manager's, a user's finalizer) added since; the
precondition makes that write fail instead, and the retry redoes it from the new object. Server-side apply is no
alternative for taints: the API declares Node `spec.taints` an atomic list, so an applier owns (and would replace)
all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpatch

from kubegpu.kube.errors import BadRequest, Conflict, Invalid
from kubegpu.kube.retry import update_with_retry


def clone(value: Any) -> Any:
    """A deep copy of a JSON-shaped value (dicts, lists, scalars); several times faster than copy.deepcopy."""
    kind = type(value)
    if kind is dict:
        return {key: clone(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [clone(item) for item in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: the result of applying ``patch`` to ``target``; neither argument is modified.

    The result shares unchanged sub-objects with ``target`` (the store treats stored objects as immutable).
    """
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Mapping[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 via ``jsonpatch``; Invalid (422) for a failed test, a missing path or a malformed operation."""
    if not isinstance(operations, list):
        raise BadRequest(f"a JSON patch must be a list of operations, got {type(operations).__name__}")
    try:
        result = jsonpatch.apply_patch(clone(target), operations, in_place=True)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise Invalid(f"JSON patch test failed: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
        raise Invalid(f"JSON patch cannot be applied: {exc}") from None
    if not isinstance(result, dict):
        raise Invalid("JSON patch replaced the whole object with a non-object")
    return result


@dataclass(frozen=True)
class MergeList:
    """A list Kubernetes merges by ``key`` (``None``: a list of scalars merged as a set), with its items' schema."""

    key: str | None
    items: Mapping[str, Any] | None = None


_CONDITIONS = MergeList("type")
_METADATA: dict[str, Any] = {"finalizers": MergeList(None), "ownerReferences": MergeList("uid")}
_CONTAINER: dict[str, Any] = {
    "env": MergeList("name"),
    "ports": MergeList("containerPort"),
    "volumeMounts": MergeList("mountPath"),
    "volumeDevices": MergeList("devicePath"),
    "resizePolicy": MergeList("resourceName"),
}
_POD_SPEC: dict[str, Any] = {
    "containers": MergeList("name", _CONTAINER),
    "initContainers": MergeList("name", _CONTAINER),
    "ephemeralContainers": MergeList("name", _CONTAINER),
    "volumes": MergeList("name"),
    "imagePullSecrets": MergeList("name"),
    "hostAliases": MergeList("ip"),
    "topologySpreadConstraints": MergeList("topologyKey"),
    "resourceClaims": MergeList("name"),
    "schedulingGates": MergeList("name"),
}
STRATEGIC_SCHEMAS: dict[str, dict[str, Any]] = {
    "Pod": {"metadata": _METADATA, "spec": _POD_SPEC, "status": {"conditions": _CONDITIONS}},
    "Node": {"metadata": _METADATA, "status": {"conditions": _CONDITIONS, "addresses": MergeList("type")}},
    "DaemonSet": {
        "metadata": _METADATA,
        "spec": {"template": {"metadata": _METADATA, "spec": _POD_SPEC}},
        "status": {"conditions": _CONDITIONS},
    },
    "PodDisruptionBudget": {"metadata": _METADATA, "status": {"conditions": _CONDITIONS}},
}
_DEFAULT_SCHEMA: dict[str, Any] = {"metadata": _METADATA}


def strategic_merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Apply a strategic merge patch to an object of ``kind`` (see the module docstring for what is supported)."""
    if not isinstance(patch, dict):
        raise BadRequest(f"a strategic merge patch must be an object, got {type(patch).__name__}")
    result = _merge_map(target, patch, STRATEGIC_SCHEMAS.get(kind, _DEFAULT_SCHEMA), "")
    return result


def _merge_map(target: Any, patch: Mapping[str, Any], schema: Mapping[str, Any] | None, path: str) -> dict[str, Any]:
    if patch.get("$patch") == "replace":
        return {key: value for key, value in patch.items() if key != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise Invalid(f"strategic merge patch at {path or '/'}: directive {key!r} is not supported")
        child_schema = schema.get(key) if schema else None
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            nested = child_schema if isinstance(child_schema, Mapping) else None
            result[key] = _merge_map(result.get(key), value, nested, f"{path}/{key}")
        elif isinstance(value, list) and isinstance(child_schema, MergeList):
            result[key] = _merge_list(result.get(key), value, child_schema, f"{path}/{key}")
        else:
            result[key] = value
    return result


def _merge_list(target: Any, patch: list[Any], spec: MergeList, path: str) -> list[Any]:
    original = list(target) if isinstance(target, list) else []
    if spec.key is None:
        return original + [item for item in patch if item not in original]
    merged = original
    for item in patch:
        if not isinstance(item, dict) or spec.key not in item:
            raise Invalid(f"strategic merge patch at {path}: every item needs its merge key {spec.key!r}")
        position = next(
            (index for index, existing in enumerate(merged)
             if isinstance(existing, dict) and existing.get(spec.key) == item[spec.key]),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                merged.pop(position)
            continue
        if position is None:
            merged.append({key: value for key, value in item.items() if key != "$patch"})
        else:
            merged[position] = _merge_map(merged[position], item, spec.items, f"{path}/{item[spec.key]}")
    return merged


# ---------------------------------------------------------------------------------------------- shared lists
def taint_identity(taint: Any) -> Any:
    """Two taints are one when key and effect agree (the value does not make another one, as in the API)."""
    return (taint.get("key"), taint.get("effect")) if isinstance(taint, Mapping) else taint


def _same(item: Any) -> Any:
    return item


@dataclass(frozen=True)
class ListEdit:
    """Entries of the list at `path` to have present (`add`: an entry already there under the same identity is left
    as it is) and absent (`remove`: every entry with one of their identities goes). `identity`: what makes two
    entries one (taints: `taint_identity`); by default the entries themselves (finalizers: a set of strings)."""

    path: tuple[str, ...]
    add: tuple[Any, ...] = ()
    remove: tuple[Any, ...] = ()
    identity: Callable[[Any], Any] = _same

    def applied(self, items: Sequence[Any] | None) -> list[Any]:
        """`items` after this edit; every other entry stays, in its place."""
        gone = {self.identity(item) for item in self.remove}
        kept = [item for item in items or () if self.identity(item) not in gone]
        present = {self.identity(item) for item in kept}
        for item in self.add:
            if self.identity(item) not in present:
                kept.append(clone(item))
                present.add(self.identity(item))
        return kept


def _at(obj: Any, path: Sequence[str]) -> Any:
    for step in path:
        obj = obj.get(step) if isinstance(obj, Mapping) else None
    return obj


def _put(patch: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for step in path[:-1]:
        patch = patch.setdefault(step, {})
    patch[path[-1]] = value


def _holds(current: Any, wanted: Any) -> bool:
    """Whether a merge patch `wanted` would leave `current` as it is."""
    if not isinstance(wanted, Mapping):
        return bool(current == wanted)
    return all((key not in current if isinstance(current, Mapping) else True) if value is None
               else _holds(current.get(key) if isinstance(current, Mapping) else None, value)
               for key, value in wanted.items())


def update_lists(cluster: Any, kind: str, name: str, edits: Sequence[ListEdit], also: Mapping[str, Any] | None = None,
                 namespace: str | None = None, seen: Mapping[str, Any] | None = None,
                 attempts: int = 10) -> dict[str, Any] | None:
    """Apply `edits` (and the merge patch `also`: labels, annotations, in the same write) to the object under a
    resourceVersion precondition, read again at the server and redone on 409 (see the module docstring).

    `seen`: the caller's copy (an informer's), tried first with its own resourceVersion, which saves the GET when
    it is current and costs one 409 when it is not. Returns the object written, or None when it already was as
    asked (nothing is sent). NotFound is raised."""

    def mutate(current: Mapping[str, Any]) -> dict[str, Any] | None:
        patch: dict[str, Any] = clone(dict(also or {}))
        changed = not _holds(current, patch)
        for edit in edits:
            before = _at(current, edit.path)
            after = edit.applied(before)
            if after != list(before or ()):
                _put(patch, edit.path, after or None)
                changed = True
        return patch if changed else None

    version = ((seen or {}).get("metadata") or {}).get("resourceVersion")
    if seen is not None and version:
        patch = mutate(seen)
        if patch is None:
            return None
        patch.setdefault("metadata", {})["resourceVersion"] = version
        try:
            written: dict[str, Any] = cluster.patch(kind, name, patch, namespace=namespace)
            return written
        except Conflict:
            pass   # the copy was behind the server: from its object now
    return update_with_retry(cluster, kind, name, mutate, namespace=namespace, attempts=attempts)
