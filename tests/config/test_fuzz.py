"""Hundreds of malformed files through `kubegpu validate-config` in-process: never a traceback, always one line.

Each case mutates one of the valid reference examples (wrong types, deleted keys, unknown keys, out-of-range numbers,
broken YAML and bytes). A mutation may leave a file legitimately valid (deleting an optional key); then the file
must really parse as the kind reported. Everything else must exit 1 with exactly one `error: <file>...` line.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import yaml
from typer.testing import CliRunner

from kubegpu.config import load_yaml_file
from kubegpu.config.deviceplugin import parse_device_plugin_config
from kubegpu.config.migparted import check_layouts, parse_mig_parted_config

DATA = Path(__file__).parent / "data"
CASES = 320
WRONG_VALUES: list[Any] = ["text", "", 7, -3, 0, 2.5, True, False, None, [], {}, [1, "x"], {"k": 1}, "all", [0]]
NUMBERS = [-1, 0, 1, 49, 1000, -(10**9), 10**12]
Path_ = tuple[Any, ...]


def _dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))


def _paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path into a parsed document (mapping keys and list indices), the root excluded."""
    found: list[Path_] = []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        path = (*prefix, key)
        found.append(path)
        found.extend(_paths(child, path))
    return found


def _get(doc: Any, path: Path_) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(doc: Any, path: Path_, value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def wrong_type(doc: Any, rng: random.Random) -> str:
    path = rng.choice(_paths(doc))
    _set(doc, path, rng.choice([v for v in WRONG_VALUES if type(v) is not type(_get(doc, path))]))
    return _dump(doc)


def delete_key(doc: Any, rng: random.Random) -> str:
    path = rng.choice([p for p in _paths(doc) if isinstance(_get(doc, p[:-1]), dict)])
    del _get(doc, path[:-1])[path[-1]]
    return _dump(doc)


def unknown_key(doc: Any, rng: random.Random) -> str:
    mappings = [()] + [p for p in _paths(doc) if isinstance(_get(doc, p), dict)]
    target = _get(doc, rng.choice(mappings))
    name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
    target[name if name not in target else name + "x"] = rng.choice(WRONG_VALUES)
    return _dump(doc)


def out_of_range(doc: Any, rng: random.Random) -> str:
    numeric = [p for p in _paths(doc) if isinstance(_get(doc, p), int) and not isinstance(_get(doc, p), bool)]
    path = rng.choice(numeric or _paths(doc))
    _set(doc, path, rng.choice(NUMBERS))
    return _dump(doc)


def garbage_yaml(doc: Any, rng: random.Random) -> str:
    text = _dump(doc)
    cut = rng.randrange(1, len(text))
    return rng.choice([
        text[:cut] + rng.choice(["{", "[", ": :", "\t- x", "'", '"', "&a *b", "!!python/object:os.system ls",
                                 "- - -", "]", "%YAML 9\n", "\x00", "@"]) + text[cut:],
        text[:cut],
        text.replace(":", "", 1),
        text.replace("\n", "\n  ", 1),
        text + text.splitlines()[0] + "\n",  # a duplicate top-level key
    ])


MUTATIONS: list[Callable[[Any, random.Random], str]] = [wrong_type, delete_key, unknown_key, out_of_range,
                                                        garbage_yaml]


def _cases(tmp_path: Path) -> list[Path]:
    examples = [load_yaml_file(p) for p in sorted(DATA.glob("*.yaml"))]
    files = []
    for i in range(CASES):
        rng = random.Random(i)
        doc = copy.deepcopy(rng.choice(examples))
        text = MUTATIONS[i % len(MUTATIONS)](doc, rng)
        path = tmp_path / f"case{i:03d}.yaml"
        if i % 41 == 40:  # now and then, bytes that are not UTF-8 at all
            path.write_bytes(text.encode()[: rng.randrange(1, 40)] + bytes([0xFF, 0xC3, 0x28]))
        else:
            path.write_text(text)
        files.append(path)
    return files


def _really_parses(path: Path, line: str) -> None:
    data = load_yaml_file(path)
    if "valid mig-parted config" in line:
        check_layouts(parse_mig_parted_config(data, str(path)))
    else:
        assert "valid device-plugin config" in line
        parse_device_plugin_config(data, str(path))


def test_generated_malformed_files_never_traceback(tmp_path: Path, cli_app: typer.Typer) -> None:
    app, runner = cli_app, CliRunner()
    rejected = 0
    for path in _cases(tmp_path):
        result = runner.invoke(app, ["validate-config", str(path)])
        assert result.exception is None or isinstance(result.exception, SystemExit), (path, result.exception)
        assert "Traceback" not in result.output
        out, err = result.stdout.splitlines(), result.stderr.splitlines()
        if result.exit_code == 0:
            assert (len(out), err) == (1, []), path.read_text()
            _really_parses(path, out[0])
        else:
            assert result.exit_code == 1
            assert out == [] and len(err) == 1, (path, err)
            assert err[0].startswith(f"error: {path}"), err[0]
            rejected += 1
    assert rejected >= 200
