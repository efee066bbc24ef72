"""NVIDIA GPU Operator `nvidia.com/v1` ClusterPolicy → ours: the migration path off the GPU Operator.

Every field whose meaning we keep is carried over under the same name; every field we cannot honour yields one line
(`spec.path: why`), so a user sees exactly what changes before switching. NVIDIA's own images are kept for the driver
and container toolkit (we do not rewrite drivers); every other operand runs our image, so NVIDIA image names there
are reported and dropped.
"""

from __future__ import annotations

from typing import Any

from kubegpu.operator.policy import API_VERSION, KIND

COMMON = {"enabled", "repository", "image", "version", "imagePullPolicy", "imagePullSecrets", "env", "resources",
          "args", "tolerations"}
IMAGE_FIELDS = {"repository", "image", "version"}
# block → (extra fields kept verbatim, whether NVIDIA's image is kept)
BLOCKS: dict[str, tuple[set[str], bool]] = {
    "driver": ({"kernelModuleType", "upgradePolicy"}, True),
    "toolkit": ({"installDir"}, True),
    "devicePlugin": ({"config", "mps"}, False),
    "migManager": ({"config"}, False),
    "gfd": (set(), False),
    "dcgmExporter": ({"config", "serviceMonitor"}, False),
    "validator": ({"driver", "toolkit", "cuda", "plugin"}, False),
    "nodeStatusExporter": (set(), False),
}
OPERATOR_FIELDS = {"defaultRuntime", "runtimeClass"}
DAEMONSETS_FIELDS = {"labels", "annotations", "tolerations", "priorityClassName", "updateStrategy"}
UPGRADE_FIELDS = {"autoUpgrade", "maxParallelUpgrades", "maxUnavailable", "waitForCompletion", "podDeletion", "drain"}
VALIDATOR_SUB_FIELDS = {"env"}
SERVICE_MONITOR_FIELDS = {"enabled", "interval", "honorLabels", "additionalLabels", "relabelings"}
CONFIG_FIELDS = {"devicePlugin": {"name", "default"}, "migManager": {"name", "default"}, "dcgmExporter": {"name"}}


def _leaves(prefix: str, value: Any) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for key, sub in value.items() for leaf in _leaves(f"{prefix}.{key}", sub)]
    return [prefix]


def _keep(src: dict[str, Any], allowed: set[str], prefix: str, notes: list[str], why: str) -> dict[str, Any]:
    out = {}
    for key, value in src.items():
        if key in allowed:
            out[key] = value
        else:
            notes += [f"{leaf}: {why}" for leaf in _leaves(f"{prefix}.{key}", value)]
    return out


def _block(name: str, src: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    extra, nvidia_image = BLOCKS[name]
    prefix = f"spec.{name}"
    out = _keep(src, COMMON | extra, prefix, notes, "not supported by kubegpu; dropped")
    if not nvidia_image:
        for key in sorted(IMAGE_FIELDS & out.keys()):
            notes.append(f"{prefix}.{key}: kubegpu runs its own image for {name}; NVIDIA's {key} "
                         f"{out.pop(key)!r} dropped")
    if name == "driver" and isinstance(out.get("upgradePolicy"), dict):
        out["upgradePolicy"] = _keep(out["upgradePolicy"], UPGRADE_FIELDS, f"{prefix}.upgradePolicy", notes,
                                     "not supported by kubegpu; dropped")
    if name in CONFIG_FIELDS and isinstance(out.get("config"), dict):
        out["config"] = _keep(out["config"], CONFIG_FIELDS[name], f"{prefix}.config", notes,
                              "not supported by kubegpu; dropped")
    if name == "dcgmExporter" and isinstance(out.get("serviceMonitor"), dict):
        out["serviceMonitor"] = _keep(out["serviceMonitor"], SERVICE_MONITOR_FIELDS, f"{prefix}.serviceMonitor",
                                      notes, "not supported by kubegpu; dropped")
    if name == "validator":
        for sub in ("driver", "toolkit", "cuda", "plugin"):
            if isinstance(out.get(sub), dict):
                out[sub] = _keep(out[sub], VALIDATOR_SUB_FIELDS, f"{prefix}.{sub}", notes,
                                 "not supported by kubegpu; dropped")
    if isinstance(out.get("imagePullSecrets"), list):
        out["imagePullSecrets"] = [s["name"] if isinstance(s, dict) and "name" in s else s
                                   for s in out["imagePullSecrets"]]
    if isinstance(out.get("env"), list):
        out["env"] = [{"name": e.get("name"), "value": str(e.get("value", ""))} if isinstance(e, dict) else e
                      for e in out["env"]]
    return out


def from_nvidia(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(our ClusterPolicy as a dict, one line per field that cannot be honoured)."""
    notes: list[str] = []
    spec_in = data.get("spec") or {}
    if not isinstance(spec_in, dict):
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": data.get("metadata"), "spec": spec_in}, notes
    spec: dict[str, Any] = {}
    for key, value in spec_in.items():
        if key in BLOCKS and isinstance(value, dict):
            spec[key] = _block(key, value, notes)
        elif key == "operator" and isinstance(value, dict):
            spec[key] = _keep(value, OPERATOR_FIELDS, "spec.operator", notes, "not supported by kubegpu; dropped")
        elif key == "daemonsets" and isinstance(value, dict):
            kept = _keep({k: v for k, v in value.items() if k != "rollingUpdate"}, DAEMONSETS_FIELDS,
                         "spec.daemonsets", notes, "not supported by kubegpu; dropped")
            rolling = value.get("rollingUpdate") or {}
            if isinstance(rolling, dict) and "maxUnavailable" in rolling:
                kept["maxUnavailable"] = rolling["maxUnavailable"]
            spec[key] = kept
        elif key == "mig" and isinstance(value, dict):
            spec[key] = _keep(value, {"strategy"}, "spec.mig", notes, "not supported by kubegpu; dropped")
        elif isinstance(value, dict) and value.get("enabled") is False:
            continue  # a disabled NVIDIA-only block loses nothing
        else:
            notes += [f"{leaf}: no kubegpu equivalent; dropped" for leaf in _leaves(f"spec.{key}", value)]
    metadata = {"name": (data.get("metadata") or {}).get("name", "cluster-policy")}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}, notes
