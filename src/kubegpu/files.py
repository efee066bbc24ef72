"""The one input/output layer for files: bounded reads, safe YAML/JSON, durable writes, checksummed state.

Every file kubegpu reads (configs, scenarios, state files, the `sim:` node file, instance-type tables) and every
file it writes (exported configs, reports, state shared between node agents) goes through here, so the same
limits hold everywhere:

- a read never takes more than `limit` bytes (a `/dev/zero` or a huge file is an error, not an OOM kill);
- text must be UTF-8; YAML is loaded safely, with duplicate keys refused, nesting depth and alias expansion capped
  ("billion laughs" documents are refused before anything walks them); JSON refuses NaN/Infinity and deep nesting;
- every problem is one `ConfigError` line that names the file (and the line for syntax errors);
- a write is durable and atomic: a uniquely named temp file in the same directory, fsync of the file, `os.replace`,
  fsync of the directory; the temp is removed on failure and stale temps from killed writers are swept later;
- state that a reader must trust can be wrapped in a checksummed envelope, so a torn or foreign file is detected and
  reported as `CorruptStateError` (the reader rebuilds from its source of truth instead of acting on garbage);
  `kubegpu.statefiles` has the two other checksummed shapes (a stamped JSON document, a checksum comment line).

This module sits at the bottom layer: it imports only `kubegpu.errors`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kubegpu.errors import ConfigError

__all__ = [
    "DEFAULT_READ_LIMIT",
    "MAX_ALIAS_EXPANSION",
    "MAX_DEPTH",
    "CorruptStateError",
    "dumps_checked",
    "dumps_checked_body",
    "file_identity",
    "load_data_file",
    "load_json_file",
    "load_yaml_file",
    "loads_checked",
    "owner_only_files",
    "parse_json_text",
    "parse_yaml_documents",
    "parse_yaml_text",
    "read_bytes",
    "read_text",
    "restrict_socket",
    "write_durable",
]

DEFAULT_READ_LIMIT = 32 * 1024 * 1024
"""Largest input file read by default (32 MiB): far above any real config, state or scenario file."""
MAX_DEPTH = 64
"""Deepest nesting of mappings/sequences accepted (real files stay under 10)."""
MAX_ALIAS_EXPANSION = 1_000_000
"""Most nodes a YAML document may expand to once aliases are followed, when it uses aliases at all."""
STALE_TEMP_SECONDS = 30.0
"""A temp file of ours older than this was left by a killed writer and is removed by the next writer."""


class CorruptStateError(ConfigError):
    """A state file is torn, truncated or foreign; the reader should rebuild it from its source of truth."""


# ---------------------------------------------------------------------------------------------- reading


def read_bytes(path: Path | str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
    """At most `limit` bytes of a file; larger (or endless, like /dev/zero) inputs are a ConfigError."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ConfigError(f"{source}: file is larger than the {_size(limit)} limit")
    return data


def read_text(path: Path | str, *, limit: int = DEFAULT_READ_LIMIT) -> str:
    """A bounded read decoded as UTF-8; a binary file is one ConfigError line naming it."""
    data = read_bytes(path, limit=limit)
    return decode_utf8(data, str(path))


def decode_utf8(data: bytes, source: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not a UTF-8 text file") from None
    if "\x00" in text:
        raise ConfigError(f"{source}: not a text file (contains NUL bytes)")
    return text.removeprefix("\ufeff")


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit} bytes"


# ---------------------------------------------------------------------------------------------- YAML

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class _StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """A SafeLoader that refuses duplicate keys: PyYAML keeps the last one silently, which hides typos."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a scalar", key_node.start_mark
            ) from None
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)  # type: ignore[no-untyped-call]
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_depth(text: str, source: str, max_depth: int) -> bool:
    """Walk the event stream (no recursion) so a deeply nested document never reaches the recursive composer.
    Returns whether the stream has an alias (without one, nothing can expand: `_check_aliases` is not needed)."""
    depth = 0
    aliases = False
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, _OPEN_EVENTS):
            depth += 1
            if depth > max_depth:
                mark = event.start_mark
                where = source if mark is None else f"{source}:{mark.line + 1}"
                raise ConfigError(f"{where}: invalid YAML: nested deeper than {max_depth} levels")
        elif isinstance(event, _CLOSE_EVENTS):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases = True
    return aliases


def _expanded_size(root: yaml.Node, source: str, limit: int) -> int:
    """Nodes the document has once aliases are followed (shared nodes counted each time); refuses alias cycles."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            children = _children(node)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), limit + 1)
            continue
        if key in sizes:
            continue
        if key in active:
            raise ConfigError(f"{source}: invalid YAML: an alias refers to its own enclosing node")
        active.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _distinct_nodes(root: yaml.Node) -> int:
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(_children(node))
    return len(seen)


def _check_aliases(node: yaml.Node, source: str, max_expansion: int) -> None:
    distinct = _distinct_nodes(node)
    expanded = _expanded_size(node, source, max(max_expansion, distinct))
    if expanded > distinct and expanded > max_expansion:
        raise ConfigError(f"{source}: invalid YAML: aliases expand to more than {max_expansion} nodes")


def _yaml_error(exc: yaml.YAMLError, source: str) -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = source if mark is None else f"{source}:{mark.line + 1}:{mark.column + 1}"
        problem = exc.problem or exc.context or "invalid YAML"
        return ConfigError(f"{where}: invalid YAML: {problem}")
    return ConfigError(f"{source}: invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _iter_yaml(text: str, source: str, max_depth: int, max_expansion: int) -> Iterator[object]:
    try:
        aliases = _check_depth(text, source, max_depth)
        loader = _StrictLoader(text)
        try:
            while loader.check_node():
                node = loader.get_node()
                if node is None:
                    continue
                if aliases:  # two walks of every node: a fleet's state file is a million of them
                    _check_aliases(node, source, max_expansion)
                yield loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source) from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. an integer with 5000 digits, a date like 2024-13-40
        raise ConfigError(f"{source}: invalid YAML value: {' '.join(str(exc).split())[:120]}") from None


def parse_yaml_text(
    text: str, source: str, *, max_depth: int = MAX_DEPTH, max_expansion: int = MAX_ALIAS_EXPANSION
) -> object:
    """One YAML (or JSON) document, safely loaded; an empty text is None; several documents are an error."""
    docs: list[object] = []
    for doc in _iter_yaml(text, source, max_depth, max_expansion):
        docs.append(doc)
        if len(docs) > 1:  # stop at the second: a huge multi-document file need not be parsed to the end
            raise ConfigError(f"{source}: expected one YAML document, found several (separated by ---)")
    return docs[0] if docs else None


def parse_yaml_documents(
    text: str, source: str, *, max_depth: int = MAX_DEPTH, max_expansion: int = MAX_ALIAS_EXPANSION
) -> list[object]:
    """Every document of a multi-document YAML stream (`---` separated), empty documents dropped."""
    return [d for d in _iter_yaml(text, source, max_depth, max_expansion) if d is not None]


def load_yaml_file(path: Path | str, *, limit: int = DEFAULT_READ_LIMIT) -> object:
    """Read (bounded, UTF-8) and parse one YAML/JSON file; every problem is a one-line ConfigError."""
    return parse_yaml_text(read_text(path, limit=limit), str(path))


# ---------------------------------------------------------------------------------------------- JSON


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json_text(text: str, source: str, *, max_depth: int = MAX_DEPTH) -> object:
    """Strict JSON (no NaN/Infinity, no numbers that overflow a float, bounded depth) or a one-line ConfigError."""
    if _json_depth(text) > max_depth:
        raise ConfigError(f"{source}: invalid JSON: nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{source}: invalid JSON: {' '.join(str(exc).split())[:120]}") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is too large")
    return value


def _json_depth(text: str) -> int:
    """Upper bound of bracket nesting, ignoring brackets inside strings (cheap, linear, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load_json_file(path: Path | str, *, limit: int = DEFAULT_READ_LIMIT) -> object:
    return parse_json_text(read_text(path, limit=limit), str(path))


def load_data_file(path: Path | str, *, limit: int = DEFAULT_READ_LIMIT) -> object:
    """`.json` files as strict JSON, everything else as YAML (a JSON superset)."""
    if str(path).endswith(".json"):
        return load_json_file(path, limit=limit)
    return load_yaml_file(path, limit=limit)


# ---------------------------------------------------------------------------------------------- writing


def write_durable(path: Path | str, data: str | bytes, *, mode: int = 0o644, sync_directory: bool = True) -> None:
    """Replace `path` atomically and durably: readers see the old file or the new one, never a torn one.

    The temp file is unique (two writers never share one: process ID and a per-process counter, created with
    O_EXCL), lives in the target's directory (so `os.replace` is a rename, not a copy), is fsynced before the rename,
    and the directory is fsynced after it so the rename itself survives a power cut. An exception removes the temp;
    temps left by killed writers are swept by the next write. `sync_directory=False` skips that last fsync, for state
    whose readers discard it after a power cut anyway (the file is still never torn: old or new, whole).

    Plain `os` calls rather than `tempfile` and a buffered file object: the DRA driver makes two to four of these
    writes on the kubelet's pod-start path, where the extra layers were most of a write's cost on tmpfs.
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    directory = directory or "."
    payload = data.encode("utf-8") if isinstance(data, str) else data
    _sweep_stale_temps(directory, name)
    fd, tmp = _create_temp(directory, name, target)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.fchmod(fd, mode)  # the mode asked for, whatever the umask (the temp is born 0600)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from None
        raise
    if sync_directory:
        _fsync_directory(directory)


_temp_serial = itertools.count()


def _create_temp(directory: str, name: str, target: str) -> tuple[int, str]:
    """A new `.<name>.<pid>-<n>.tmp` beside the target, opened for writing; never one that exists (a killed
    writer's temp whose process ID came back is skipped, and swept once stale)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}-{next(_temp_serial)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from None
    raise ConfigError(f"{target}: cannot write: no unused temporary file name in {directory}")


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and Windows) cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


_last_sweep: dict[tuple[str, str], float] = {}
"""(directory, name) → when this process last swept it: a file rewritten often (a checkpoint saved several times per
request) is swept once per STALE_TEMP_SECONDS, not listed on every write; a temp only becomes stale after that long."""
_SWEEP_MEMORY = 4096


def _sweep_stale_temps(directory: str, name: str) -> None:
    """Remove `.<name>.*.tmp` files older than STALE_TEMP_SECONDS: leftovers of writers killed mid-write."""
    now = time.time()
    key = (directory, name)
    if now - _last_sweep.get(key, -STALE_TEMP_SECONDS) < STALE_TEMP_SECONDS:
        return
    if len(_last_sweep) >= _SWEEP_MEMORY:  # many one-off names (one CDI spec per claim): forget, sweep again later
        _last_sweep.clear()
    _last_sweep[key] = now
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    prefix = f".{name}."
    for entry in entries:
        if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_SECONDS:
                    os.unlink(entry.path)


def file_identity(path: Path | str) -> tuple[int, int, int] | None:
    """A cheap "has this file changed?" token (None: absent), following symlinks. The inode is part of it: a durable
    write replaces the inode, and a per-node config switch re-points a symlink at another file that may have the
    same size and mtime as the one before (kubegpu.configmanager)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@contextlib.contextmanager
def owner_only_files() -> Iterator[None]:
    """Files and unix sockets created inside are 0600 (umask 0177): gRPC servers bind their socket with the
    process umask, and a socket anyone on the node can connect to would let any local user talk to the plugin."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def restrict_socket(path: Path | str, mode: int = 0o600) -> None:
    """Set a unix socket's mode after bind (0600, or 0660 where a group such as the kubelet's needs access)."""
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot restrict the socket's permissions: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------------------------- checksummed state


def dumps_checked(kind: str, version: int, data: object) -> str:
    """A JSON envelope `{kind, version, sha256, data}`; `loads_checked` verifies all four."""
    return dumps_checked_body(kind, version, json.dumps(data, sort_keys=True, separators=(",", ":")))


def dumps_checked_body(kind: str, version: int, body: str) -> str:
    """`dumps_checked` for data already serialized canonically (`sort_keys`, compact separators), so a writer that
    keeps the serialized parts of a large state need not encode all of it again; the envelope embeds `body` as is."""
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f'{{"data":{body},"kind":{json.dumps(kind)},"sha256":"{digest}","version":{int(version)}}}'


def loads_checked(text: str, source: str, kind: str, version: int) -> object:
    """The `data` of an envelope written by `dumps_checked`; CorruptStateError when torn, foreign or tampered."""
    try:
        envelope = parse_json_text(text, source)
    except ConfigError as exc:
        raise CorruptStateError(f"{exc} (torn or not a {kind} file)") from None
    if not isinstance(envelope, dict) or envelope.get("kind") != kind:
        raise CorruptStateError(f"{source}: not a {kind} state file")
    if envelope.get("version") != version:
        raise CorruptStateError(f"{source}: {kind} state version {envelope.get('version')!r}, expected {version}")
    data = envelope.get("data")
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(body.encode("utf-8")).hexdigest() != envelope.get("sha256"):
        raise CorruptStateError(f"{source}: {kind} state checksum mismatch")
    return data

