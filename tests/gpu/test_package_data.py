"""`pip install .` (the README's first command) ships every data file the package reads, not only the .py files."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kubegpu"


def _shipped(relative: str, patterns: list[str]) -> bool:
    # setuptools' recursive `**/` also matches files at the package's top level
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(relative, p.removeprefix("**/")) for p in patterns)


def test_every_data_file_under_the_package_is_declared_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kubegpu"]
    data_files = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*")
                  if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts]
    assert "exporter/data/default-counters.csv" in data_files  # the exporter's default counters are read at run time
    assert [f for f in data_files if not _shipped(f, patterns)] == []
