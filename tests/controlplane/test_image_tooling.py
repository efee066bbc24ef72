"""The chart tier's tooling without buildah, Helm or a node: Helm's pin, the image's cache key (what invalidates it
and what does not), the mirror debootstrap uses, one-line errors, and the API-access admission policy's shape."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubegpu.errors import KubegpuError
from kubegpu.testing import chart, helmbuild, image

ROOT = Path(__file__).resolve().parents[2]


def test_helm_is_pinned_in_its_tools_module(tmp_path: Path) -> None:
    version = helmbuild.read_version()
    assert version.startswith("v4.")
    assert helmbuild.binary().parts[-4:] == ("helm", version, "bin", "helm")
    bad = tmp_path / "go.mod"
    bad.write_text("module x\n")
    with pytest.raises(KubegpuError, match=r"no `require helm\.sh/helm/v4 vX\.Y\.Z` line"):
        helmbuild.read_version(bad)


def test_the_image_cache_key_follows_the_build_context(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    (root / "src" / "kubegpu" / "testing").mkdir(parents=True)
    (root / "src" / "kubegpu" / "cli.py").write_text("x = 1\n")
    (root / "src" / "kubegpu" / "testing" / "chart.py").write_text("y = 1\n")
    (root / "deploy" / "crds").mkdir(parents=True)
    (root / "deploy" / "crds" / "a.yaml").write_text("kind: CustomResourceDefinition\n")
    first = image.inputs_hash(root, "base-1")
    assert image.inputs_hash(root, "base-1") == first  # deterministic
    (root / "src" / "kubegpu" / "testing" / "chart.py").write_text("y = 2\n")  # .dockerignore: not in the image
    (root / "src" / "kubegpu" / "__pycache__").mkdir()
    (root / "src" / "kubegpu" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    assert image.inputs_hash(root, "base-1") == first
    assert image.inputs_hash(root, "base-2") != first  # a new base image
    (root / "src" / "kubegpu" / "cli.py").write_text("x = 2\n")
    assert image.inputs_hash(root, "base-1") != first  # a source change
    assert "src/kubegpu/testing" in (ROOT / ".dockerignore").read_text().splitlines()


def test_debootstrap_uses_the_mirror_apt_uses(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
                       "Components: main\n\nTypes: deb\nURIs: http://security.example/debian-security\n"
                       "Suites: bookworm-security\nComponents: main\n")
    assert image.apt_mirror(sources) == "http://mirror.example/debian"
    assert image.apt_mirror(tmp_path / "absent") == image.DEFAULT_MIRROR


def test_a_missing_tool_is_one_line_naming_what_installs_it() -> None:
    with pytest.raises(KubegpuError) as caught:
        image._run(["kubegpu-no-such-tool", "x"], "build the base")
    assert str(caught.value) == ("build the base: `kubegpu-no-such-tool` is not installed (scripts/build-image.sh "
                                 "installs buildah debootstrap with apt-get)")


def test_api_access_policy_targets_only_labelled_namespaces() -> None:
    policy, binding = chart.api_access_policy("https://127.0.0.1:6443")
    assert (policy["kind"], binding["kind"]) == ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {chart.API_ACCESS_LABEL: "true"}}
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    expression = policy["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert "hostNetwork: true" in expression and '"127.0.0.1"' in expression and '"6443"' in expression
