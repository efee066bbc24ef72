"""The Cluster interface against a real API server, through lightkube's sync client.

Built-in kinds use lightkube's typed resources; kubegpu's custom resources (and any kind registered later with
`register_kind`) use `lightkube.generic_resource`. Objects go in and come out as plain dicts. API failures become
the shared `ApiError` subclasses; an unreachable server becomes one `KubegpuError` line naming the server.

Watches are read with our own loop over lightkube's request builder and line decoder (lightkube's `Client.watch`
reconnects forever and cannot stop at a deadline): each request asks the server for ``timeoutSeconds`` and reads with
a client-side deadline, so ``timeout`` holds even against servers that ignore ``timeoutSeconds``. ``timeout=0`` reads
for a short window (`DRAIN_WINDOW_S`) — a remote server has no local queue to drain.

Every call rides out API-server faults (429, 5xx, dropped connections) with capped, jittered exponential backoff
(`kubegpu.kube.retry.RetryPolicy`), retrying only what cannot be done twice: see that module for the rules.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import lightkube
import yaml
from lightkube import ALL_NS, KubeConfig
from lightkube.core.exceptions import LoadResourceError, NotReadyError
from lightkube.core.generic_client import WatchDriver
from lightkube.core.resource_registry import resource_registry
from lightkube.core.selector import build_selector
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Binding, ConfigMap, Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import load_yaml_file
from kubegpu.kube.cluster import PATCH_TYPES, Cluster, WatchEvent
from kubegpu.kube.errors import ApiError, BadRequest, Conflict, Invalid, NotFound, error_for
from kubegpu.kube.resources import ResourceKind, resource_kind
from kubegpu.kube.retry import RetryPolicy, is_transient
from kubegpu.kube.selectors import parse_field_selector, parse_label_selector

DRAIN_WINDOW_S = 0.3
_TYPED: dict[str, Any] = {
    "Node": Node, "Pod": Pod, "ConfigMap": ConfigMap, "Event": Event, "DaemonSet": DaemonSet, "Lease": Lease,
    "PodDisruptionBudget": PodDisruptionBudget, "Binding": Binding,
}
_ANSWERED_WITH_STATUS = frozenset({"Binding"})
_PATCH_TYPES = {"merge": PatchType.MERGE, "json": PatchType.JSON, "strategic": PatchType.STRATEGIC}


class LightkubeCluster(Cluster):
    """Cluster over lightkube; ``client=None`` reads in-cluster config, then $KUBECONFIG, then ~/.kube/config."""

    def __init__(self, client: lightkube.Client | None = None, clock: Clock | None = None,
                 retry: RetryPolicy | None = None) -> None:
        if client is None:
            try:
                client = lightkube.Client(config=_kubeconfig())
            except lightkube.ConfigError as exc:
                raise KubegpuError(f"no Kubernetes API configuration (in-cluster or kubeconfig): {exc}") from None
            except ConfigError as exc:  # unreadable, too large, not UTF-8, bad YAML: already names the file
                raise KubegpuError(str(exc)) from None
            except (yaml.YAMLError, OSError, TypeError, KeyError, AttributeError, ValueError) as exc:
                # lightkube lets a malformed kubeconfig's own parse error escape, often several lines long
                where = os.environ.get("KUBECONFIG") or "~/.kube/config"
                raise KubegpuError(f"kubeconfig {where}: cannot be used: {' '.join(str(exc).split())}") from None
        self.client = client
        self.clock: Clock = clock or RealClock()
        self.retry = retry or RetryPolicy()

    # ------------------------------------------------------------------ reads
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        spec, resource = _resource(kind)

        def once() -> dict[str, Any]:
            with _api_errors(f"get {kind} {name}", self.client):
                return first_decode((resource, "one"), lambda: _as_dict(
                    self.client.get(resource, name, namespace=_namespace(spec, namespace))))

        return self.retry.call(once, is_transient)

    def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        spec, resource = _resource(kind)
        labels, fields = _selectors(kind, label_selector, field_selector)

        def once() -> tuple[builtins.list[dict[str, Any]], str]:
            def read() -> tuple[builtins.list[dict[str, Any]], str]:
                listing = self.client.list(resource, namespace=_list_namespace(spec, namespace), labels=labels,
                                           fields=fields)
                items = [_as_dict(item) for item in listing]
                try:
                    return items, listing.resourceVersion
                except NotReadyError:  # an empty first page may carry no resourceVersion
                    return items, ""

            with _api_errors(f"list {kind}", self.client):
                return first_decode((resource, "list"), read)

        items, version = self.retry.call(once, is_transient)
        items.sort(key=lambda obj: (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        return items, version

    # ------------------------------------------------------------------ writes
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(obj, dict) or not obj.get("kind"):
            raise Invalid(f"object to create: kind: Required value (got {type(obj).__name__})")
        kind = str(obj["kind"])
        spec, resource = _resource(kind)
        body = dict(obj, apiVersion=spec.api_version, kind=kind)
        metadata = dict(body.get("metadata") or {})
        if spec.namespaced:
            metadata["namespace"] = metadata.get("namespace") or "default"
        else:
            metadata.pop("namespace", None)
        body["metadata"] = metadata
        name = metadata.get("name") or metadata.get("generateName", "")
        if kind in _ANSWERED_WITH_STATUS:
            return self.retry.call(lambda: self._post_for_status(kind, resource.from_dict(body), metadata, body),
                                   _rejected_unprocessed)
        attempts = 0

        def once() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            try:
                with _api_errors(f"create {kind} {name}", self.client):
                    return first_decode((resource, "one"), lambda: _as_dict(
                        self.client.create(resource.from_dict(body), namespace=metadata.get("namespace"))))
            except Conflict as exc:
                # a retried create of a fixed name meeting AlreadyExists: the first attempt went through before its
                # answer was lost; return that object instead of failing (or, worse, creating a second one)
                if attempts > 1 and exc.reason == "AlreadyExists" and metadata.get("name"):
                    return self.get(kind, str(metadata["name"]), metadata.get("namespace"))
                raise

        return self.retry.call(once, is_transient if metadata.get("name") else _rejected_unprocessed)

    def _post_for_status(self, kind: str, obj: Any, metadata: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """POST a create-only kind the server answers with a `Status` (a Binding): nothing to decode as the kind."""
        generic = self.client._client
        with _api_errors(f"create {kind} {metadata.get('name')}", self.client):
            request = generic.prepare_request("post", obj=obj, namespace=metadata.get("namespace"))
            request.response_type = None
            generic.handle_response("post", generic.send(generic.build_adapter_request(request)), request)
        return body

    def patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any] | builtins.list[Any],
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        spec, resource = _resource(kind)
        if patch_type not in PATCH_TYPES:
            raise BadRequest(f"patch type {patch_type!r} is not one of {', '.join(PATCH_TYPES)}")
        if subresource not in (None, "status") or (subresource == "status" and not spec.status_subresource):
            raise NotFound(f"{kind} has no subresource {subresource!r}")
        target = resource.Status if subresource == "status" else resource

        def once() -> dict[str, Any]:
            with _api_errors(f"patch {kind} {name}", self.client):
                return first_decode((target, "one"), lambda: _as_dict(self.client.patch(
                    target, name, patch, namespace=_namespace(spec, namespace), patch_type=_PATCH_TYPES[patch_type])))

        # merge/strategic patches land on the same object however often they are sent; a JSON patch may not
        return self.retry.call(once, _rejected_unprocessed if patch_type == "json" else is_transient)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        spec, resource = _resource(kind)
        attempts = 0

        def once() -> None:
            nonlocal attempts
            attempts += 1
            try:
                with _api_errors(f"delete {kind} {name}", self.client):
                    first_decode((resource, "delete"),
                                  lambda: self.client.delete(resource, name, namespace=_namespace(spec, namespace)))
            except NotFound:
                if attempts == 1:  # gone before we asked; after a lost answer, gone because of us
                    raise

        self.retry.call(once, is_transient)

    # ------------------------------------------------------------------ watches
    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
        bookmarks: bool = False,
    ) -> Iterator[WatchEvent]:
        spec, resource = _resource(kind)
        labels, fields = _selectors(kind, label_selector, field_selector)
        window = DRAIN_WINDOW_S if timeout == 0 else timeout
        return self._stream(kind, spec, resource, namespace, labels, fields, resource_version, window, bookmarks)

    def _stream(
        self, kind: str, spec: ResourceKind, resource: Any, namespace: str | None, labels: dict[str, Any] | None,
        fields: dict[str, Any] | None, resource_version: str | None, window: float | None,
        bookmarks: bool = False,
    ) -> Iterator[WatchEvent]:
        deadline = None if window is None else time.monotonic() + window
        generic = self.client._client  # lightkube's GenericSyncClient: request building and decoding
        request = generic.prepare_request(
            "list", res=resource, namespace=_list_namespace(spec, namespace), watch=True,
            params={
                "resourceVersion": resource_version,
                "labelSelector": build_selector(labels) if labels else None,
                "fieldSelector": build_selector(fields, for_fields=True) if fields else None,
                "allowWatchBookmarks": "true" if bookmarks else None,
            },
        )
        driver = WatchDriver(request, generic._client.build_request)
        params: dict[str, Any] = request.params
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            params["timeoutSeconds"] = None if remaining is None else max(1, math.ceil(remaining))
            read_timeout = httpx2.Timeout(10.0, read=remaining)
            with _api_errors(f"watch {kind}", self.client):
                response = generic.send(driver.get_request(timeout=read_timeout), stream=True)
                try:
                    _raise_for_status(response)
                    for line in response.iter_lines():
                        if not line.strip():
                            continue
                        if '"BOOKMARK"' in line[:40]:  # only a version: not decodable as the kind's model
                            version = str(((json.loads(line).get("object") or {}).get("metadata") or {})
                                          .get("resourceVersion") or "")
                            if version:
                                driver._version = version
                                if bookmarks:
                                    yield WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": version}})
                            continue
                        event_type, obj = first_decode((resource, "watch"), partial(driver.process_one_line, line))
                        yield WatchEvent(event_type, _as_dict(obj))
                        if deadline is not None and time.monotonic() >= deadline:
                            return
                except httpx2.ReadTimeout:
                    return
                finally:
                    response.close()


_DECODE_LOCK = threading.Lock()
_DECODED: set[tuple[Any, str]] = set()
T = TypeVar("T")


def first_decode(key: tuple[Any, str], call: Callable[[], T]) -> T:
    """`call()`, alone in the process the first time a response of this kind and shape is decoded. lightkube
    decodes with msgspec, which builds a model's type information on its first use; two threads building it at
    once (the informers' first lists share ObjectMeta) crashed the interpreter with SIGSEGV under load. Later calls
    take no lock. `key`: the resource class and what is decoded (one object, a list, a watch event, a delete)."""
    if key in _DECODED:
        return call()
    with _DECODE_LOCK:
        result = call()
        _DECODED.add(key)
        return result


def _kubeconfig() -> KubeConfig:
    """In-cluster config, else $KUBECONFIG (its first file), else ~/.kube/config — the file read through
    kubegpu.files (bounded, UTF-8, safe YAML), so a broken kubeconfig is one line naming it."""
    try:
        return KubeConfig.from_service_account()
    except lightkube.ConfigError:
        pass
    first = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    path = Path(first or "~/.kube/config").expanduser()
    if not path.is_file():
        raise lightkube.ConfigError(f"Configuration file {path} not found")
    try:
        data = load_yaml_file(path, limit=4 * 1024 * 1024)
    except ConfigError as exc:
        detail = str(exc).removeprefix(str(path)).lstrip(":0123456789 ")
        raise ConfigError(f"kubeconfig {path}: cannot be used: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"kubeconfig {path}: cannot be used: a kubeconfig must be a mapping")
    return KubeConfig.from_dict(data, fname=path)


def _resource(kind: str) -> tuple[ResourceKind, Any]:
    spec = resource_kind(kind)
    typed = _TYPED.get(kind)
    if typed is not None:
        return spec, typed
    with suppress(LoadResourceError):  # a built-in kind lightkube models (a generic class would clash with it)
        return spec, resource_registry.load(spec.api_version, spec.kind)
    create = create_namespaced_resource if spec.namespaced else create_global_resource
    return spec, create(spec.group, spec.version, spec.kind, spec.plural)


def _namespace(spec: ResourceKind, namespace: str | None) -> str | None:
    return (namespace or "default") if spec.namespaced else None


def _list_namespace(spec: ResourceKind, namespace: str | None) -> str | None:
    return (namespace or ALL_NS) if spec.namespaced else None


def _selectors(kind: str, label_selector: str | None, field_selector: str | None
               ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Our selector strings as lightkube's selector dicts (validated the same way as in the memory store)."""
    labels: dict[str, Any] = {}
    for requirement in parse_label_selector(label_selector).requirements:
        if requirement.key in labels:
            raise BadRequest(f"label selector {label_selector!r}: key {requirement.key!r} appears twice")
        labels[requirement.key] = _label_value(requirement.operator, requirement.values)
    fields: dict[str, Any] = {}
    for field in parse_field_selector(field_selector, kind).requirements:
        if field.path in fields:
            raise BadRequest(f"field selector {field_selector!r}: field {field.path!r} appears twice")
        fields[field.path] = lightkube.operators.not_equal(field.value) if field.negated else field.value
    return labels or None, fields or None


def _label_value(operator: str, values: frozenset[str]) -> Any:
    ordered = sorted(values)
    if operator == "Exists":
        return lightkube.operators.exists()
    if operator == "DoesNotExist":
        return lightkube.operators.not_exists()
    if operator == "In":
        return ordered[0] if len(ordered) == 1 else lightkube.operators.in_(ordered)
    return lightkube.operators.not_equal(ordered[0]) if len(ordered) == 1 else lightkube.operators.not_in(ordered)


def _as_dict(obj: Any) -> dict[str, Any]:
    data = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return data if isinstance(data, dict) else {}


def _raise_for_status(response: httpx2.Response) -> None:
    if response.status_code < 400:
        return
    response.read()
    try:
        status = response.json()
    except ValueError:
        status = {}
    message = status.get("message") or response.text[:200] or f"HTTP {response.status_code}"
    raise error_for(int(status.get("code") or response.status_code), message, status.get("reason"))


@contextmanager
def _api_errors(action: str, client: lightkube.Client) -> Iterator[None]:
    """Translate lightkube/httpx failures into ApiError subclasses or one KubegpuError line."""
    try:
        yield
    except ApiError as exc:
        raise error_for(exc.code, f"{action}: {exc}", exc.reason) from None
    except lightkube.ApiError as exc:
        status = exc.status
        code = int(status.code or 500)
        raise error_for(code, f"{action}: {status.message or status.reason}", status.reason) from None
    except httpx2.HTTPStatusError as exc:  # an error body lightkube did not decode (not application/json)
        response = exc.response
        try:
            body = response.json()
        except ValueError:
            body = {}
        message = body.get("message") or f"HTTP {response.status_code}"
        raise error_for(response.status_code, f"{action}: {message}", body.get("reason")) from None
    except httpx2.TransportError as exc:  # 503 so the retry policy treats a dropped connection like a restart
        server = getattr(client.config.cluster, "server", "?")
        raise ApiError(f"{action}: cannot reach the Kubernetes API server at {server}: {exc}", code=503,
                       reason="ServiceUnavailable") from None


def _rejected_unprocessed(exc: BaseException) -> bool:
    """429: the server refused before doing anything, so even a non-idempotent request may be sent again."""
    return isinstance(exc, ApiError) and exc.code == 429
