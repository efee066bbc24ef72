"""deploy/kubernetes/dra/place.yaml: valid objects for the API, a hardened non-root container running
`kubegpu place`, included by the directory's kustomization (its RBAC is exercised on the real API server by
tests/controlplane/test_placement.py, which runs the controller with this ServiceAccount's token)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

DRA = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra"


def test_place_manifest_is_valid_hardened_and_included() -> None:
    docs = [d for d in yaml.safe_load_all((DRA / "place.yaml").read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["kubegpu", "place"]
    assert pod["serviceAccountName"] == "kubegpu-place"
    context = container["securityContext"]
    assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "place.yaml" in yaml.safe_load((DRA / "kustomization.yaml").read_text())["resources"]
