"""dcgm-exporter's collector CSV format: `<field>, <type>, <help>` per line.

Dashboards and alerts are keyed on these field names, so a user's existing counters file must load unchanged.
Like dcgm-exporter, a malformed record rejects the whole file (naming the line), while a field we cannot
collect is skipped with a warning, so one exotic counter never takes the exporter down.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kubegpu.errors import ConfigError
from kubegpu.exporter.fields import KNOWN_FIELDS
from kubegpu.files import read_text

METRIC_TYPES = ("gauge", "counter", "histogram", "summary", "label")


@dataclass(frozen=True)
class CounterSpec:
    field: str
    type: str
    help: str
    line: int


@dataclass(frozen=True)
class CounterSet:
    counters: tuple[CounterSpec, ...]
    warnings: tuple[str, ...]

    @property
    def series(self) -> tuple[CounterSpec, ...]:
        """Counters exported as their own series."""
        return tuple(c for c in self.counters if c.type != "label")

    @property
    def labels(self) -> tuple[CounterSpec, ...]:
        """Counters exported as a label on every other series."""
        return tuple(c for c in self.counters if c.type == "label")


def parse_counters(text: str, source: str) -> CounterSet:
    counters: list[CounterSpec] = []
    warnings: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        malformed = f"{source}:{number}: malformed CSV record on line {number}"
        try:
            record = [part.strip() for part in next(csv.reader([stripped], skipinitialspace=True, strict=True))]
        except csv.Error as exc:
            raise ConfigError(f"{malformed}: {exc}") from None
        if len(record) != 3:
            raise ConfigError(f"{malformed}: expected 3 fields (field, type, help), got {len(record)}")
        field, metric_type, help_text = record
        if not field:
            raise ConfigError(f"{malformed}: the field name is empty")
        if metric_type not in METRIC_TYPES:
            raise ConfigError(
                f"{source}:{number}: unknown metric type {metric_type!r} for {field} on line {number}; "
                f"expected one of {', '.join(METRIC_TYPES)}"
            )
        if field not in KNOWN_FIELDS:
            warnings.append(f"{source}: skipping line {number} ({field}): metric not supported by kubegpu")
            continue
        counters.append(CounterSpec(field=field, type=metric_type, help=help_text, line=number))
    return CounterSet(counters=tuple(counters), warnings=tuple(warnings))


def default_counters_text() -> str:
    return resources.files("kubegpu.exporter").joinpath("data/default-counters.csv").read_text()


def load_counters(path: Path | str | None) -> CounterSet:
    """Load a counters file, or the built-in default set when no path is given."""
    if path is None:
        return parse_counters(default_counters_text(), "default-counters.csv")
    file = Path(path)
    return parse_counters(read_text(file), str(file))  # bounded, UTF-8
