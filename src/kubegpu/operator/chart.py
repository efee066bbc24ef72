"""The Helm chart's values.schema.json, generated so its `clusterPolicy.spec` is exactly the ClusterPolicy model.

Regenerate after a model change with `python -m kubegpu.operator.chart` (a test fails while the file is stale).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubegpu.operator.policy import ClusterPolicySpec

CHART_DIR = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "kubegpu"

_RESOURCES = {
    "type": "object", "additionalProperties": False,
    "properties": {"requests": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}},
                   "limits": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}},
}


def values_schema() -> dict[str, Any]:
    spec = ClusterPolicySpec.model_json_schema(mode="validation")
    defs = spec.pop("$defs", {})
    defs["ClusterPolicySpec"] = spec
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "kubegpu Helm values",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "image": {
                "description": "The one kubegpu image: every component, `kubegpu` as entrypoint.",
                "type": "object", "additionalProperties": False,
                "properties": {
                    "repository": {"type": "string", "minLength": 1, "description": "image repository"},
                    "tag": {"type": "string", "description": "image tag; empty means the chart's appVersion"},
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
                "required": ["repository"],
            },
            "imagePullSecrets": {"type": "array", "items": {"type": "string"},
                                 "description": "names of Secrets for pulling the image"},
            "operator": {
                "description": "The operator Deployment.",
                "type": "object", "additionalProperties": False,
                "properties": {
                    "replicas": {"type": "integer", "minimum": 0,
                                 "description": "replicas; one acts, the others wait on the leader Lease"},
                    "applyCRDs": {"type": "boolean",
                                  "description": "server-side apply the project's CRDs at start (helm upgrade "
                                                 "never updates crds/)"},
                    "cleanupOnUninstall": {"type": "boolean",
                                           "description": "helm uninstall first deletes the ClusterPolicy, waits "
                                                          "for the operands and removes the stack's node labels"},
                    "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                    "resources": _RESOURCES,
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "tolerations": {"type": "array", "items": {"type": "object"}},
                    "affinity": {"type": "object"},
                    "priorityClassName": {"type": "string"},
                },
            },
            "clusterPolicy": {
                "description": "The ClusterPolicy this release creates.",
                "type": "object", "additionalProperties": False,
                "properties": {
                    "create": {"type": "boolean", "description": "create the default ClusterPolicy"},
                    "name": {"type": "string", "minLength": 1},
                    "spec": {"$ref": "#/$defs/ClusterPolicySpec",
                             "description": "a ClusterPolicy spec (kubegpu.io/v1, GPU Operator field names)"},
                },
            },
        },
        "$defs": defs,
    }


def render_values_schema() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    (CHART_DIR / "values.schema.json").write_text(render_values_schema())
