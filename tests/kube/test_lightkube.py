"""LightkubeCluster specifics: what goes over the wire, and failures turned into one-line errors."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx2
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from kubegpu.errors import KubegpuError
from kubegpu.kube import BadRequest, LightkubeCluster
from tests.fakes.apiserver import ApiServer


def test_selectors_reach_the_server_in_api_syntax(apiserver: ApiServer) -> None:
    cluster = apiserver.cluster()
    cluster.list("Pod", "ml", label_selector="gpu in (a100,h100),!mig,tier!=batch",
                 field_selector="spec.nodeName=n1,status.phase!=Succeeded")
    request = apiserver.requests()[-1]
    assert request.params["labelSelector"] == "gpu in (a100,h100),!mig,tier!=batch"
    assert request.params["fieldSelector"] == "spec.nodeName=n1,status.phase!=Succeeded"
    assert str(request.url.path) == "/api/v1/namespaces/ml/pods"


def test_watch_asks_for_resource_version_and_server_timeout(apiserver: ApiServer) -> None:
    apiserver.reset()  # kmock replays every object on a watch: other tests' NodeClaims would come back
    cluster = apiserver.cluster()
    assert list(cluster.watch("NodeClaim", resource_version="7", label_selector="pool=gpu", timeout=0.2)) == []
    request = apiserver.requests()[-1]
    assert str(request.url.path) == "/apis/kubegpu.io/v1/nodeclaims"
    assert request.params["watch"] == "true"
    assert request.params["resourceVersion"] == "7"
    assert request.params["timeoutSeconds"] == "1"
    assert request.params["labelSelector"] == "pool=gpu"


def test_patch_types_use_the_api_content_types(apiserver: ApiServer) -> None:
    apiserver.reset()
    cluster = apiserver.cluster()
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ct"}})
    for patch_type, body, content_type in [
        ("merge", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"),
        ("strategic", {"metadata": {"labels": {"a": "c"}}}, "application/strategic-merge-patch+json"),
        ("json", [{"op": "add", "path": "/metadata/labels/b", "value": "d"}], "application/json-patch+json"),
    ]:
        cluster.patch("Node", "ct", body, patch_type=patch_type)
        assert apiserver.requests()[-1].headers["Content-Type"] == content_type
    cluster.patch("Node", "ct", {"status": {"capacity": {"pods": "110"}}}, subresource="status")
    assert str(apiserver.requests()[-1].url.path) == "/api/v1/nodes/ct/status"


def test_bad_selector_fails_before_any_request(apiserver: ApiServer) -> None:
    before = len(apiserver.requests())
    with pytest.raises(BadRequest, match="label selector"):
        apiserver.cluster().list("Node", label_selector="gpu in a100")
    with pytest.raises(BadRequest, match="appears twice"):
        apiserver.cluster().list("Node", label_selector="a!=1,a!=2")
    assert len(apiserver.requests()) == before


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_server_is_one_line_naming_it() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    client = Client(config=KubeConfig.from_one(cluster=Cluster(server=url), user=User(token="t")), trust_env=False,
                    timeout=httpx2.Timeout(2.0))
    with pytest.raises(KubegpuError) as caught:
        LightkubeCluster(client).get("Node", "n1")
    message = str(caught.value)
    assert message.startswith(f"get Node n1: cannot reach the Kubernetes API server at {url}")
    assert "\n" not in message


def test_missing_configuration_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubegpuError, match="no Kubernetes API configuration"):
        LightkubeCluster()


@pytest.mark.parametrize("text", ["garbage: [\n", "apiVersion: v1\nkind: Config\nclusters: 5\n"])
def test_malformed_kubeconfig_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubegpuError, match=f"kubeconfig {kubeconfig}: cannot be used: ") as caught:
        LightkubeCluster()
    assert "\n" not in str(caught.value)
