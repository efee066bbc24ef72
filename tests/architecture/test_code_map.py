"""The code base keeps the shape issue #12 gave it: short modules, resource names built in one place, and a code map
(docs/internals.md) that names only what exists. Import rules themselves are checked by `lint-imports`."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "kubegpu"
NAMES = SRC / "sharing" / "names.py"
MAX_LINES = 500


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_pb2" not in p.name)


def test_no_source_module_is_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by concern: {long}"


# A string literal that *is* an NVIDIA resource name, or an f-string that composes one.
_RESOURCE_LITERAL = re.compile(r"^nvidia\.com/(gpu(\.shared)?|gpu-\d+gb|mig-\S+)$")
_COMPOSED = re.compile(r"nvidia\.com/[^\"' ]*\{|\}\.shared[\"']")


def _resource_name_sites(path: Path) -> list[str]:
    sites = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type != tokenize.STRING:
            continue
        text = token.string
        prefix = text[: len(text) - len(text.lstrip("rbfuRBFU"))].lower()
        body = text[len(prefix):].strip("\"'")
        if ("f" in prefix and _COMPOSED.search(text)) or _RESOURCE_LITERAL.match(body):
            sites.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {text}")
    return sites


def test_resource_names_are_built_only_in_sharing_names() -> None:
    sites = [site for p in _sources() if p != NAMES for site in _resource_name_sites(p)]
    assert sites == [], "build resource names with kubegpu.sharing.names:\n" + "\n".join(sites)


def test_the_names_checker_finds_what_it_should(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('A = "nvidia.com/gpu"\nB = f"nvidia.com/gpu-{n}gb"\nC = f"{name}.shared"\n'
                      'D = """docs about nvidia.com/gpu"""\nE = "nvidia.com/gpu.product"\n')
    found = [site.split(": ", 1)[1] for site in _resource_name_sites_outside_root(sample)]
    assert found == ['"nvidia.com/gpu"', 'f"nvidia.com/gpu-{n}gb"', 'f"{name}.shared"']


def _resource_name_sites_outside_root(path: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return _resource_name_sites(path)
    finally:
        ROOT = saved


_MODULE_PATH = re.compile(r"`(kubegpu(?:\.[a-z_0-9]+)+)`|\b(src/kubegpu/[\w/]+\.py)\b")


def test_every_module_the_code_map_names_exists() -> None:
    text = (ROOT / "docs" / "internals.md").read_text()
    missing = []
    for dotted, path in _MODULE_PATH.findall(text):
        if path:
            if not (ROOT / path).exists():
                missing.append(path)
            continue
        parts = dotted.split(".")
        # `kubegpu.pkg.module` or `kubegpu.pkg.module.name` (a name inside a module)
        candidates = [ROOT / "src" / Path(*parts[:n]) for n in range(len(parts), 1, -1)]
        if not any(c.with_suffix(".py").exists() or (c / "__init__.py").exists() for c in candidates[:2]):
            missing.append(dotted)
    assert missing == [], f"docs/internals.md names modules that do not exist: {sorted(set(missing))}"


def test_node_agent_commands_load_no_cluster_controller() -> None:
    """A node agent's command (the partition agent's too) loads its own component, never a controller package: a
    DaemonSet pod stays small and the node side never depends on the cluster side."""
    import subprocess
    import sys

    for command in ("partition-agent", "gpu-guard", "device-plugin"):
        code = ("import sys; from kubegpu.cli import build_app, COMMAND_COMPONENTS; "
                f"build_app([COMMAND_COMPONENTS[{command!r}]]); "
                "print(','.join(sorted(m for m in sys.modules if m.split('.')[:2] in "
                "(['kubegpu', 'partitioner'], ['kubegpu', 'autoscaler'], ['kubegpu', 'operator'], "
                "['kubegpu', 'quota']))))")
        loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert loaded.strip() == "", f"{command} loads {loaded.strip()}"
