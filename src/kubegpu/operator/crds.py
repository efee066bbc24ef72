"""The CRDs the operator server-side-applies at start, so `helm upgrade` (which never touches crds/) cannot leave a
stale schema behind. ClusterPolicy's is generated from the models; the others are read from the CRD directory
(deploy/crds in the repository, /opt/kubegpu/crds in the image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubegpu.config.crds import write_crd
from kubegpu.operator.policy import clusterpolicy_crd

REPO_CRDS = Path(__file__).resolve().parents[3] / "deploy" / "crds"
IMAGE_CRDS = Path("/opt/kubegpu/crds")
HEADER = "Generated from kubegpu.operator.policy by `kubegpu operator crds --output-dir deploy/crds`; do not edit."


def generated_crds() -> list[dict[str, Any]]:
    from kubegpu.quota.api import elastic_quota_crd

    return [clusterpolicy_crd(), elastic_quota_crd()]


def default_crds_dir() -> Path | None:
    for candidate in (IMAGE_CRDS, REPO_CRDS):
        if candidate.is_dir():
            return candidate
    return None


def file_crds(directory: Path | None) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in DIR/*.yaml (one ConfigError line per bad file)."""
    from kubegpu.errors import ConfigError
    from kubegpu.files import load_yaml_file

    if directory is None:
        return []
    out = []
    for path in sorted(directory.glob("*.yaml")):
        data = load_yaml_file(path)
        if not isinstance(data, dict) or data.get("kind") != "CustomResourceDefinition":
            raise ConfigError(f"{path}: not a CustomResourceDefinition")
        out.append(data)
    return out


def all_crds(directory: Path | None = None) -> list[dict[str, Any]]:
    """Generated CRDs, then the directory's (a generated one wins over a file of the same name), sorted by name."""
    generated = generated_crds()
    names = {crd["metadata"]["name"] for crd in generated}
    others = [crd for crd in file_crds(directory or default_crds_dir()) if crd["metadata"]["name"] not in names]
    return sorted(generated + others, key=lambda crd: crd["metadata"]["name"])


def write_all(directory: Path) -> list[Path]:
    return [write_crd(crd, directory, HEADER) for crd in generated_crds()]
