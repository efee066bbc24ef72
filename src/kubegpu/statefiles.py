"""Checksummed state files that people and other programs also read: a torn or foreign file is detected, not used.

`kubegpu.files` has the envelope `{kind, version, sha256, data}` for state only kubegpu reads (the DRA checkpoint,
the MPS slices file). Two files cannot take that shape without breaking their other readers, so they carry their
SHA-256 differently:

- a JSON document people read and write by hand (the `sim:` node file, the MPS limits record) gets a top-level
  `sha256` field over the rest of the document (`stamp_checksum` / `verify_checksum`). Its shape is unchanged; a
  document without the field is accepted as hand-written, one whose field does not match is a CorruptStateError.
  The hash is over canonical JSON (sorted keys, no spaces), so re-indenting a file keeps it valid;
- a line-based file other programs parse (NFD's `features.d` `key=value` files, where a line starting with `#` is a
  comment and `# +` starts a directive) gets a first line `# kubegpu-sha256=<hex>` over the lines after it
  (`stamp_lines` / `verify_lines`). First, so a file torn anywhere no longer matches its checksum; with `=`, so a
  naive `key=value` splitter does not fail on it.

Pure: text and parsed documents in, text and documents out; reading and writing stay in `kubegpu.files`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubegpu.files import CorruptStateError

__all__ = ["CHECKSUM_FIELD", "LINE_CHECKSUM_PREFIX", "dumps_stamped", "stamp_checksum", "stamp_lines",
           "verify_checksum", "verify_lines"]

CHECKSUM_FIELD = "sha256"
"""The field that carries a stamped JSON document's checksum."""
LINE_CHECKSUM_PREFIX = "# kubegpu-sha256="
"""First line of a checksummed line-based file: a plain comment to NFD (not a `# +` directive)."""


def _digest(data: object, *, json_born: bool) -> str:
    """SHA-256 of the canonical JSON of `data`.

    Data about to be written is first passed through JSON once: `{2: .., 10: ..}` sorts as integers but is read back
    with string keys that sort as "10" < "2"; hashing what the reader will see keeps writer and reader in step.
    """
    canonical = data if json_born else json.loads(json.dumps(data))
    body = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def stamp_checksum(document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` with a `sha256` field (first) over the rest of it; any `sha256` it had is replaced."""
    body = {k: v for k, v in document.items() if k != CHECKSUM_FIELD}
    return {CHECKSUM_FIELD: _digest(body, json_born=False), **body}


def dumps_stamped(document: Mapping[str, Any], *, string_keys: bool = False) -> str:
    """`stamp_checksum` as compact JSON text in one encoding pass: the canonical body with the checksum put in front.

    `string_keys`: the caller guarantees every mapping key in `document` is a string (state that came from JSON), so
    the canonical form can be hashed as encoded, without the normalising round trip.
    """
    body_doc = {k: v for k, v in document.items() if k != CHECKSUM_FIELD}
    if not string_keys:
        body_doc = json.loads(json.dumps(body_doc))
    body = json.dumps(body_doc, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f'{{"{CHECKSUM_FIELD}":"{digest}"' + ("," + body[1:] if body != "{}" else "}")


def verify_checksum(document: object, source: str, what: str) -> bool:
    """Check and remove the `sha256` field of a parsed JSON object; False when it has none (a hand-written file).

    A field that does not match is a CorruptStateError naming the file: torn, tampered, or edited by hand without
    removing the field (the message says so, as that is the usual cause).
    """
    if not isinstance(document, dict) or CHECKSUM_FIELD not in document:
        return False
    recorded = document.pop(CHECKSUM_FIELD)
    if recorded != _digest(document, json_born=True):
        raise CorruptStateError(f"{source}: {what} checksum mismatch: the file is torn or was changed after it was "
                                f"written (after a hand edit, delete its {CHECKSUM_FIELD!r} field)")
    return True


def stamp_lines(text: str) -> str:
    """`text` behind a comment line that carries the SHA-256 of `text`."""
    return f"{LINE_CHECKSUM_PREFIX}{hashlib.sha256(text.encode('utf-8')).hexdigest()}\n{text}"


def verify_lines(text: str, source: str, what: str) -> tuple[str, bool]:
    """The text after a `stamp_lines` comment, checked, and True; a text without that first line as it is, False."""
    if not text.startswith(LINE_CHECKSUM_PREFIX):
        return text, False
    first, _, rest = text.partition("\n")
    if first.removeprefix(LINE_CHECKSUM_PREFIX).strip() != hashlib.sha256(rest.encode("utf-8")).hexdigest():
        raise CorruptStateError(f"{source}: {what} checksum mismatch: the file is torn or was changed after it was "
                                "written (after a hand edit, delete its first line)")
    return rest, True
