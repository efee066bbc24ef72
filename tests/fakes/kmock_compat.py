"""kmock 0.8 made faithful enough for real clients: our own compatibility layer over its KubernetesEmulator.

What it adds (each item broke a real client against plain kmock; see reference/deps.md §1d):
- ``metadata.uid``, ``creationTimestamp``, ``generation`` and one monotonically increasing ``resourceVersion``
  stamped on every create, patch and deletion mark; list responses report the current resourceVersion;
- the namespace taken from the URL when a created body has none; ``generateName``; **201** on create;
- Kubernetes-shaped errors: 404 ``NotFound`` naming the object, 409 ``AlreadyExists`` on a duplicate create,
  409 ``Conflict`` on a patch carrying a stale ``resourceVersion``, 422 ``Invalid`` on a failed JSON-patch ``test``;
- ``GET /version/``, ``/api/``, ``/apis/`` (trailing slashes); ``watch=True``/``watch=1`` treated as a watch;
- ``timeoutSeconds`` on watches (the stream ends when it passes);
- discovery entries for every kind in `kubegpu.kube.resources.KINDS`, so listing an empty kind is not a 404.

Still missing (kmock's gaps; the contract suite checks them on MemoryCluster and on the real API server instead):
PUT, label and field selectors (ignored), watch resume from a resourceVersion (a watch replays every object as
ADDED), strategic merge of lists (lists are replaced), and ``/status`` isolation (a status patch can change spec and
vice versa).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
from kmock._internal import enums, rendering

from kubegpu.kube.patching import merge_patch
from kubegpu.kube.resources import KINDS

_KMOCK_REASONS = {
    "Not Found": "NotFound",
    "Object Not Found": "NotFound",
    "Resource Not Found": "NotFound",
    "Endpoint Not Found": "NotFound",
    "Object Already Exists": "AlreadyExists",
}


class CompatEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator plus the compatibility fixes listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)
        self._current_version = 0
        self._write_lock = asyncio.Lock()
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback["get /api/"] << self._serve_api
        self.fallback["get /apis/"] << self._serve_apis
        for spec in KINDS.values():
            key = kmock.resource(spec.group, spec.version, spec.plural)
            self.resources[key] = kmock.ResourceInfo(
                kind=spec.kind,
                namespaced=spec.namespaced,
                verbs={"create", "delete", "get", "list", "patch", "watch"},
                subresources={"status"} if spec.status_subresource else set(),
            )

    def _next_version(self) -> str:
        self._current_version = next(self._versions)
        return str(self._current_version)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        watching = str(request.params.get("watch", "")).lower() in ("true", "1")
        if watching and request.method == enums.method.GET and request.action != enums.action.WATCH:
            # kmock matches reactions against the very request object it recorded, so adjust that one in place.
            object.__setattr__(request, "action", enums.action.WATCH)
        if request.action not in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE,
                                  enums.action.FETCH):
            return await super()._handle(request)
        async with self._write_lock:
            if request.action == enums.action.CREATE:
                self._prepare_create(request)
            else:
                self._require_existing(request)
                if request.action == enums.action.UPDATE:
                    self._prepare_patch(request)
                elif request.action == enums.action.DELETE:
                    self._prepare_delete(request)
            response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)
        return response

    def _key(self, request: rendering.Request, namespace: str | None, name: str | None) -> tuple[Any, ...]:
        return (request.resource, namespace, name)

    def _existing(self, key: tuple[Any, ...]) -> Any:
        if key in self._objects and not self._objects[key].deleted:
            return self._objects[key]
        return None

    def _require_existing(self, request: rendering.Request) -> None:
        key = self._key(request, request.namespace, request.name)
        if self._existing(key) is None:
            plural = request.resource.plural if request.resource is not None else "objects"
            raise kmock.KubernetesError(404, "NotFound", f'{plural} "{request.name}" not found', {})

    def _prepare_create(self, request: rendering.Request) -> None:
        body = request.data
        if not isinstance(body, dict):
            raise kmock.KubernetesError(400, "BadRequest", "the body of a create must be an object", {})
        metadata = body.setdefault("metadata", {})
        if request.namespace and not metadata.get("namespace"):
            metadata["namespace"] = request.namespace
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        key = self._key(request, metadata.get("namespace"), metadata.get("name"))
        if self._existing(key) is not None:
            plural = request.resource.plural if request.resource is not None else "objects"
            raise kmock.KubernetesError(409, "AlreadyExists", f'{plural} "{metadata.get("name")}" already exists', {})
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata["generation"] = 1
        metadata["resourceVersion"] = self._next_version()

    def _prepare_patch(self, request: rendering.Request) -> None:
        current = self._objects[self._key(request, request.namespace, request.name)].raw
        current_version = (current.get("metadata") or {}).get("resourceVersion")
        body = request.data
        if isinstance(body, list):
            try:
                patched = jsonpatch.apply_patch(current, body)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise kmock.KubernetesError(422, "Invalid", f"JSON patch test failed: {exc}", {}) from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise kmock.KubernetesError(422, "Invalid", f"JSON patch cannot be applied: {exc}", {}) from None
            self._check_version(request, (patched.get("metadata") or {}).get("resourceVersion"), current_version)
            body.append({"op": "add", "path": "/metadata/resourceVersion", "value": self._next_version()})
            return
        if not isinstance(body, dict):
            raise kmock.KubernetesError(415, "UnsupportedMediaType", "patch body must be JSON", {})
        content_type = request.headers.get("Content-Type", "")
        if content_type.startswith("application/strategic-merge-patch") and self._is_custom(request):
            raise kmock.KubernetesError(415, "UnsupportedMediaType",
                                        "strategic merge patch is not supported for custom resources", {})
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            metadata = body["metadata"] = {}
        self._check_version(request, metadata.get("resourceVersion"), current_version)
        if request.subresource is None and _spec_changes(current, body):
            metadata["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1
        metadata["resourceVersion"] = self._next_version()

    @staticmethod
    def _is_custom(request: rendering.Request) -> bool:
        group = request.resource.group if request.resource is not None else None
        return any(spec.is_custom and spec.group == group for spec in KINDS.values())

    def _check_version(self, request: rendering.Request, wanted: Any, current: Any) -> None:
        if wanted is not None and str(wanted) != str(current):
            plural = request.resource.plural if request.resource is not None else "objects"
            raise kmock.KubernetesError(
                409, "Conflict",
                f'Operation cannot be fulfilled on {plural} "{request.name}": the object has been modified; '
                "please apply your changes to the latest version and try again", {},
            )

    def _prepare_delete(self, request: rendering.Request) -> None:
        stored = self._objects[self._key(request, request.namespace, request.name)]
        metadata = stored.raw.get("metadata") or {}
        if metadata.get("finalizers") and not metadata.get("deletionTimestamp"):
            stored.patch({"metadata": {"resourceVersion": self._next_version()}})

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        if isinstance(payload, dict):
            payload["metadata"] = {"resourceVersion": str(self._current_version)}
        return payload

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        stream = super()._serve_watch(request)
        seconds = request.params.get("timeoutSeconds")
        if not seconds:
            async for item in stream:
                yield item
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(seconds)
        try:
            while (remaining := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(anext(stream), remaining)
                except (TimeoutError, StopAsyncIteration):
                    return
                yield item
        finally:
            await stream.aclose()

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            reason = _KMOCK_REASONS.get(exc.reason or "", exc.reason)
            status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": exc.status,
                      "reason": reason, "message": exc.message or reason, "details": exc.details or {}}
            # Exactly "application/json", as the API server sends it (lightkube only decodes errors with that type).
            return aiohttp.web.Response(body=json.dumps(status).encode(), status=exc.status,
                                        headers={"Content-Type": "application/json"})
        return await super()._render_error(exc)


def _spec_changes(current: dict[str, Any], patch: dict[str, Any]) -> bool:
    """Whether a (merge-style) patch changes anything outside metadata and status: what bumps generation."""
    outside = {key: value for key, value in patch.items() if key not in ("metadata", "status")}
    if not outside:
        return False
    before = {key: value for key, value in current.items() if key not in ("metadata", "status")}
    return bool(merge_patch(before, outside) != before)
