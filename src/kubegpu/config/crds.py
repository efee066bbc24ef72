"""CustomResourceDefinitions generated from the pydantic models, so a CRD schema can never drift from the code
that reads the object.

The API server wants a *structural* schema: every node has a `type` (or one of the `x-kubernetes-*` escapes), no
`$ref`, no `anyOf` of types, no `title`. pydantic's JSON schema is close; this module closes the gap.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

_DROP = {"title", "discriminator"}
_SCALARS = {"string", "integer", "number", "boolean"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every `$ref` (CRD schemas cannot refer to definitions)."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)
        return _resolve(target, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _is_null(node: dict[str, Any]) -> bool:
    return node.get("type") == "null"


def structural(node: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as a structural OpenAPI v3 node."""
    out = {key: value for key, value in node.items() if key not in _DROP}
    for union in ("anyOf", "oneOf"):
        if union not in out:
            continue
        options = [option for option in out.pop(union) if not _is_null(option)]
        if len(node[union]) != len(options):
            out["nullable"] = True
        types = {option.get("type") for option in options}
        if len(options) == 1:
            merged = structural(options[0])
            merged.update({k: v for k, v in out.items() if k not in merged})
            out = merged
        elif types <= {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "properties" in out:
        out["properties"] = {name: structural(prop) for name, prop in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(out["additionalProperties"])
    elif out.get("additionalProperties") is True:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif out.get("additionalProperties") is False:
        del out["additionalProperties"]
    if "items" in out:
        out["items"] = structural(out["items"])
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "default" in out and out.get("nullable") and out["default"] is None:
        del out["default"]
    if "type" not in out and not any(k.startswith("x-kubernetes") for k in out):
        out["x-kubernetes-preserve-unknown-fields"] = True
        out.setdefault("type", "object")
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a model (its `$defs` inlined)."""
    raw = model.model_json_schema(mode="validation", by_alias=True)
    defs = raw.pop("$defs", {})
    return structural(_resolve(raw, defs))


def custom_resource_definition(
    *, group: str, kind: str, plural: str, spec: type[BaseModel], status: type[BaseModel] | None = None,
    scope: str = "Cluster", version: str = "v1", short_names: tuple[str, ...] = (),
    printer_columns: tuple[dict[str, Any], ...] = (), categories: tuple[str, ...] = ("kubegpu",),
) -> dict[str, Any]:
    """A complete `apiextensions.k8s.io/v1` CRD whose `spec` (and `status`) schemas come from the models."""
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": model_schema(spec),
    }
    version_entry: dict[str, Any] = {"name": version, "served": True, "storage": True}
    if status is not None:
        properties["status"] = model_schema(status)
        version_entry["subresources"] = {"status": {}}
    if printer_columns:
        version_entry["additionalPrinterColumns"] = list(printer_columns)
    version_entry["schema"] = {"openAPIV3Schema": {"type": "object", "properties": properties}}
    names: dict[str, Any] = {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()}
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "names": names, "scope": scope, "versions": [version_entry]},
    }


def write_crd(crd: dict[str, Any], directory: Path, header: str = "") -> Path:
    """Write `<name>.yaml` (the file the chart's crds/ and deploy/crds hold); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{crd['metadata']['name']}.yaml"
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    path.write_text(comment + yaml.safe_dump(crd, sort_keys=False, width=120))
    return path
