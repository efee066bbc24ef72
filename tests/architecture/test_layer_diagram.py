"""docs/internals.md's layer diagram is the `.importlinter` layers contract, drawn: same packages, same order, same
siblings. A package added to one and not the other, or moved, fails here, so the code map stays true."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PACKAGES = r"kubegpu\.\w+(?:\s*\|\s*kubegpu\.\w+)*"


def contract_layers() -> list[set[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    raw = config["importlinter:contract:layers"]["layers"]
    return [{name.strip() for name in line.split("|")} for line in raw.strip().splitlines() if line.strip()]


def diagram_layers() -> list[set[str]]:
    """The packages on each layer of the first code block under `## Layers`; a line that starts with `|` continues
    the layer above (a long line of siblings)."""
    text = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    layers: list[set[str]] = []
    for line in block.splitlines():
        continued = re.match(rf"^\s+\|\s*({_PACKAGES})", line)
        starts = re.match(rf"^({_PACKAGES})", line)
        if continued and layers:
            layers[-1] |= {name.strip() for name in continued.group(1).split("|")}
        elif starts:
            layers.append({name.strip() for name in starts.group(1).split("|")})
    return layers


def test_the_documented_layers_are_the_import_contract() -> None:
    documented, enforced = diagram_layers(), contract_layers()
    assert len(documented) == len(enforced), (documented, enforced)
    for depth, (doc, contract) in enumerate(zip(documented, enforced, strict=True)):
        assert doc == contract, f"layer {depth}: docs/internals.md has {sorted(doc)}, .importlinter {sorted(contract)}"


def test_every_package_is_on_a_layer() -> None:
    on_a_layer = set().union(*contract_layers())
    packages = {f"kubegpu.{p.name}" for p in (ROOT / "src" / "kubegpu").iterdir()
                if (p / "__init__.py").exists() and p.name not in ("proto",)}
    modules = {f"kubegpu.{p.stem}" for p in (ROOT / "src" / "kubegpu").glob("*.py")
               if p.stem not in ("__init__", "__main__")}
    assert packages - on_a_layer == set() or packages - on_a_layer <= {"kubegpu.cli"}, packages - on_a_layer
    assert {"kubegpu.proto"} <= on_a_layer
    assert (modules - on_a_layer) <= {"kubegpu.cli"}, modules - on_a_layer
