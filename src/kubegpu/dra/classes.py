"""The DeviceClasses kubegpu ships (package data, identical to deploy/kubernetes/dra/deviceclasses.yaml)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from kubegpu.files import parse_yaml_documents

DEVICE_CLASSES_FILE = "deviceclasses.yaml"


def shipped_class_objects() -> list[dict[str, Any]]:
    text = resources.files("kubegpu.dra").joinpath("data", DEVICE_CLASSES_FILE).read_text(encoding="utf-8")
    return [d for d in parse_yaml_documents(text, DEVICE_CLASSES_FILE) if isinstance(d, dict)]
