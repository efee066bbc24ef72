"""The one error type every component raises for bad input.

A `KubegpuError` carries a single line that names the thing at fault (a file, a field path, a device id).
The CLI turns it into `error: <line>` and exit status 1, so users never see a traceback for bad input.
"""

from __future__ import annotations


class KubegpuError(Exception):
    """Bad input or an unavailable dependency, described in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(KubegpuError):
    """A configuration file, scenario, CR or state file is invalid."""


class NotFoundError(KubegpuError):
    """A named thing (GPU model, profile, config name, device id) does not exist."""
