"""The compat layer's own fixes, checked with a plain HTTP client (no lightkube in between)."""

from __future__ import annotations

import json

import httpx2

from tests.fakes.apiserver import ApiServer


def test_discovery_routes_with_trailing_slashes(apiserver: ApiServer) -> None:
    for path in ("/version/", "/api/", "/apis/", "/version", "/api"):
        assert httpx2.get(apiserver.url + path).status_code == 200, path


def test_create_answers_201_and_takes_namespace_from_url(apiserver: ApiServer) -> None:
    apiserver.reset()
    response = httpx2.post(apiserver.url + "/api/v1/namespaces/ml/configmaps",
                           json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    assert response.status_code == 201
    assert response.json()["metadata"]["namespace"] == "ml"
    assert httpx2.get(apiserver.url + "/api/v1/namespaces/ml/configmaps/c").status_code == 200


def test_capitalised_watch_flag_streams_and_timeout_seconds_ends_it(apiserver: ApiServer) -> None:
    apiserver.reset()
    httpx2.post(apiserver.url + "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w"}})
    with httpx2.stream("GET", apiserver.url + "/api/v1/nodes?watch=True&timeoutSeconds=1", timeout=10) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [(line["type"], line["object"]["metadata"]["name"]) for line in lines] == [("ADDED", "w")]


def test_errors_are_kubernetes_status_objects(apiserver: ApiServer) -> None:
    response = httpx2.get(apiserver.url + "/api/v1/nodes/absent")
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json"
    status = response.json()
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)
    assert status["message"] == 'nodes "absent" not found'
