"""The Prometheus 0.0.4 text format, written the way dcgm-exporter writes it.

prometheus_client sorts every series' labels alphabetically and names a counter's HELP/TYPE lines `<name>_total`.
dcgm-exporter writes labels in its template order (`gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE,
GPU_I_ID], Hostname, <label fields>, pod, namespace, container, vgpu`) and counters under their bare field names;
people grep and diff that text, so we keep each series' labels in the order they were built and the family's own name.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

_PROMETHEUS_TYPES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _header_name(family: Metric) -> str:
    """A prometheus_client Counter's samples are `<name>_total`; a DCGM counter's samples carry the bare name."""
    if family.type == "counter" and family.samples and family.samples[0].name == f"{family.name}_total":
        return f"{family.name}_total"
    return family.name


def render_text(families: Iterable[Metric]) -> bytes:
    """HELP, TYPE and one line per sample, labels in insertion order."""
    lines: list[str] = []
    for family in families:
        name = _header_name(family)
        lines.append(f"# HELP {name} {_escape_help(family.documentation)}\n")
        lines.append(f"# TYPE {name} {_PROMETHEUS_TYPES.get(family.type, family.type)}\n")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape_label_value(value)}"' for key, value in sample.labels.items())
            series = f"{sample.name}{{{labels}}}" if labels else sample.name
            lines.append(f"{series} {floatToGoString(sample.value)}\n")
    return "".join(lines).encode()
