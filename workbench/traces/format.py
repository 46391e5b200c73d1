"""The trace file: JSON Lines, versioned (``docs/traces.md``; ``docs/trace.schema.json`` is its JSON Schema).

Line 1 is the header, every following non-blank line one scheduler step::

    {"format":"linattn-trace","version":1,"profile":"sglang","layer":"gdn","num_slots":9,
     "buckets":{"decode":[1,2,4,8]},"draft_tokens":2,"seed":0}
    {"step":0,"mode":"extend","rows":[{"id":0,"slot":1,"req_pool_index":1,"seq_len":5,"new_tokens":5,
     "cached_tokens":0,"accepted":null}],"admit":[0],"finish":[],"metadata":null}

Header fields (:class:`~workbench.traces.model.TraceHeader`): ``format`` ("linattn-trace"), ``version`` (1),
``profile`` (a key of :data:`workbench.profiles.PROFILES`), ``layer`` (a key of :data:`workbench.layers.LAYERS`,
:data:`~workbench.layer_names.LAYER_NAMES`), ``num_slots`` (state slots, the dummy slot included, >= 2),
``buckets`` (graph mode -> captured batch sizes, strictly increasing; "decode" required, "target_verify" needed
by verify steps), ``draft_tokens`` (D: tokens a verify row feeds, default 2), ``seed`` (of a simulation, or
null), ``engine`` (optional: the release the trace comes from, ``{"name": "sglang", "version": "0.5.23",
"commit": "..."}``; ``name`` the profile's engine, ``commit`` optional; written only when present),
``accepted`` (what a verify row's ``accepted`` counts: "tokens", the default, or "drafts"; written only when
not the default), ``zero_on_alloc`` (the engine zeroes a slot when it allocates it; written only when true),
``topk`` (draft tokens each node of a draft tree expands: 1, the default, chains; above 1 sglang's tree drafts,
refused by a profile without tree verify; written only when above 1).

Step fields (:class:`~workbench.traces.model.TraceStep`): ``step`` (strictly increasing), ``mode`` (one of
:data:`~workbench.traces.model.STEP_MODES`), ``rows`` (one object per request, in the engine's order; an idle
step has none, every other step at least one), ``admit`` / ``finish`` (request ids given a pool row before the
step / freed after it), ``metadata`` (what the engine used, by its field names, or null: then it is built).

Row fields (:class:`~workbench.traces.model.TraceRow`): ``id``, ``slot`` (< num_slots), ``req_pool_index``,
``seq_len`` (>= 1), ``new_tokens`` (>= 1: decode 1, verify D, extend the chunk), ``cached_tokens``
(>= 0; extend and mixed rows: ``seq_len == cached_tokens + new_tokens``), ``accepted`` (verify rows only:
null, or 1..D tokens kept, or 0..D-1 drafts under the header's ``accepted: "drafts"``), ``tokens``
(optional: ``new_tokens`` token ids), ``slots`` (optional), ``kind`` ("decode", "verify", "extend": optional
where the mode says it, and then the mode's; in a mixed step on every row, or, in a file written before rows
had kinds, on none), ``tree`` (optional, verify rows: the parent of each fed token, node 0 the root, -1;
``0 <= tree[t] < t``; a tree that is not a chain needs the header's ``topk > 1``). Ids, slots and
request-pool rows are each unique within a step. The prefix-cache keys of ``metadata`` (``PREFIX_KEYS``) and
vLLM's split keys (``SPLIT_KEYS``) are checked for shape; the tree verify keys (``TREE_KEYS``:
``accept_index``, each verify row's accepted root-first path of global node ids, required with trees that are
not chains; ``last_correct_step_indices``, the node each committed) against the rows' trees and kept tokens.

Every refusal is a :class:`TraceError` of one line naming the file's line, the field and what was expected:
``line 7: rows[2].seq_len: expected an int >= 1, got -3``. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from workbench.engine_versions import ENGINE_NAMES
from workbench.errors import WorkbenchError
from workbench.layer_names import LAYER_NAMES
from workbench.limits import INT32_MAX, INT64_MAX
from workbench.profiles import PROFILES
from workbench.traces.model import (
    ACCEPTED_UNITS,
    FINAL_TRACK_FIELDS,
    FORMAT,
    MODE_KINDS,
    ROW_KINDS,
    STEP_MODES,
    TREE_KEYS,
    VERSION,
    Trace,
    TraceEngine,
    TraceHeader,
    TraceRow,
    TraceStep,
    tree_step_problem,
)

LAYERS = LAYER_NAMES
"""The header's ``layer`` values: the keys of ``workbench.layers.LAYERS`` (that module imports torch)."""
GRAPH_MODES = ("decode", "target_verify")
"""The modes with graphs: ``workbench.metadata.GRAPH_MODES`` (repeated here: that module imports torch)."""
HEADER_FIELDS = (
    "format", "version", "profile", "layer", "num_slots", "buckets", "draft_tokens", "seed", "engine", "accepted",
    "zero_on_alloc", "topk",
)  # fmt: skip
ENGINE_FIELDS = ("name", "version", "commit")
"""The header's ``engine`` object: ``name`` and ``version`` required, ``commit`` optional (null or absent)."""
_RELEASE_TEXT = "a string of 1 to 100 ASCII letters, digits or punctuation"
STEP_FIELDS = ("step", "mode", "rows", "admit", "finish", "metadata")
ROW_FIELDS = (
    "id", "slot", "req_pool_index", "seq_len", "new_tokens", "cached_tokens", "accepted", "tokens", "slots", "kind",
    "tree",
)  # fmt: skip
OPTIONAL_ROW_FIELDS = ("tokens", "slots", "kind", "tree")
"""Row fields written only when a row has them (files without them stay as they were)."""
INT32_MIN = -(2**31)
_SHOW_CHARS = 60
TraceSource = str | os.PathLike[str] | Iterable[str] | Iterable[bytes]
"""A path (a ``str`` is always a path) or the file's lines (``str``, or ``bytes`` read as UTF-8)."""
_MISSING: Any = object()


class TraceError(WorkbenchError, ValueError):
    """A trace line the reader refuses. The message is one line: ``line 7: rows[2].seq_len: expected an int
    >= 1, got -3``; ``line`` is the file's 1-based line number, ``field`` the field's path ("" for the line)."""

    def __init__(self, message: str, line: int = 0, field: str = "") -> None:
        super().__init__(message)
        self.line = line
        self.field = field


def _show(value: Any) -> str:
    """``value`` as JSON, on one line, cut after a few dozen characters; ``nothing`` for a missing field."""
    if value is _MISSING:
        return "nothing"
    try:
        text = json.dumps(value)  # ensure_ascii: no U+2028 or other line breaks in the message
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def _key(key: str) -> str:
    """A key as a field path shows it: as it is when it is a plain name, else as a JSON string (one line)."""
    return key if key.isascii() and key.isidentifier() else json.dumps(key)[:_SHOW_CHARS]


def _a(word: str) -> str:
    """``word`` with its article: "an extend", "a slot"."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _fail(line: int, path: str, expected: str, got: Any, shown: str | None = None) -> TraceError:
    """``line N: path: expected ..., got ...`` (``got`` shown as JSON, or ``shown`` as it is)."""
    where = f"{path}: " if path else ""
    return TraceError(f"line {line}: {where}expected {expected}, got {shown or _show(got)}", line, path)


def _int(value: Any, line: int, path: str, minimum: int, maximum: int, expected: str | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools and floats refused."""
    if type(value) is int and minimum <= value <= maximum:  # the common case, decided first (a bool's type is bool)
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(line, path, expected or f"an int >= {minimum}", value)
    if value > maximum:
        bits = "int32" if maximum == INT32_MAX else "int64"
        raise _fail(line, path, expected or f"an int <= {maximum} ({bits})", value)
    return value


def _ints_within(values: tuple[Any, ...], minimum: int, maximum: int) -> bool:
    """Whether every value is an int (not a bool) in ``[minimum, maximum]``: a long list checked at once, its
    messages' paths built only when one is refused (:func:`_int` then says which)."""
    return all(type(v) is int for v in values) and (not values or minimum <= min(values) and max(values) <= maximum)


def _list(value: Any, line: int, path: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(line, path, f"a list of {what}", value)
    return value


def _object(value: Any, line: int, path: str, known: tuple[str, ...], what: str) -> dict[str, Any]:
    """``value`` as a JSON object whose keys are all in ``known``."""
    if not isinstance(value, dict):
        raise _fail(line, path, f"an object ({what})", value)
    for key in value:
        if key not in known:
            where = f"{path}.{_key(key)}" if path else _key(key)
            raise TraceError(f"line {line}: {where}: unknown {what} field (known: {', '.join(known)})", line, where)
    return value


# ---------------------------------------------------------------------------------------------------- lines


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


class _Constant(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _constant(text: str) -> Any:
    raise _Constant(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Constant(text)
    return value


def parse_line(text: str, line: int) -> dict[str, Any]:
    """One line's JSON object (duplicate keys, NaN and infinities refused)."""
    try:
        obj = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
    except _Duplicate as e:
        raise TraceError(f"line {line}: {_key(e.key)}: the field appears twice", line, _key(e.key)) from None
    except _Constant as e:
        raise TraceError(f"line {line}: expected finite JSON numbers, got {e.text[:_SHOW_CHARS]}", line) from None
    except json.JSONDecodeError as e:
        raise TraceError(
            f"line {line}: expected a JSON object, got invalid JSON: {e.msg} (column {e.colno})", line
        ) from None
    except ValueError as e:  # an int of more digits than Python converts
        raise TraceError(
            f"line {line}: expected a JSON object, got invalid JSON: {' '.join(str(e).split())}", line
        ) from None
    except RecursionError:
        raise TraceError(f"line {line}: expected a JSON object, got JSON nested too deeply", line) from None
    if not isinstance(obj, dict):
        raise _fail(line, "", "a JSON object", obj)
    return obj


def _open_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading in binary, once it is known to be a regular file (a FIFO would block
    forever, ``/dev/zero`` grow without end, a folder raise): else one line naming the path."""
    name = os.fspath(path)
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        raise TraceError(f"{name}: no such file", 0, "file") from None
    except OSError as e:
        raise TraceError(f"{name}: cannot be read ({e.strerror})", 0, "file") from None
    if stat.S_ISDIR(mode):
        raise TraceError(f"{name}: is a folder, expected a trace file (JSON Lines)", 0, "file")
    if not stat.S_ISREG(mode):
        raise TraceError(f"{name}: not a regular file (a pipe, socket or device), expected a trace file", 0, "file")
    try:
        return open(name, "rb")  # noqa: SIM115 - the caller's with closes it
    except OSError as e:
        raise TraceError(f"{name}: cannot be read ({e.strerror})", 0, "file") from None


def _text_lines(source: TraceSource) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line of a path or of an iterable of lines; a file is read in
    binary and decoded line by line, so that bytes that are not UTF-8 name their line."""
    if isinstance(source, (str, os.PathLike)):
        with _open_file(source) as f:
            for number, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TraceError(
                        f"line {number}: expected UTF-8 text, got byte {raw[e.start]:#04x}", number
                    ) from None
                yield number, text
        return
    for number, item in enumerate(source, 1):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"line {number}: expected UTF-8 text, got bytes that are not", number) from None
        if not isinstance(item, str):
            raise TraceError(f"line {number}: expected a line of text, got {_a(type(item).__name__)}", number)
        yield number, item


_Records = Generator[tuple[int, dict[str, Any]], None, None]


def _records(source: TraceSource) -> _Records:
    """(line number, object) of every non-blank line."""
    for number, text in _text_lines(source):
        if text.strip():
            yield number, parse_line(text, number)


# --------------------------------------------------------------------------------------------------- header


def _buckets(value: Any, line: int) -> dict[str, list[int]]:
    """``buckets``: graph mode -> non-empty strictly increasing ints >= 1; "decode" required."""
    obj = _object(value, line, "buckets", GRAPH_MODES, "graph mode")
    if "decode" not in obj:
        raise _fail(line, "buckets.decode", "a list of bucket sizes (idle steps run the decode graph)", _MISSING)
    out: dict[str, list[int]] = {}
    for mode, sizes in obj.items():
        path = f"buckets.{mode}"
        sizes = _list(sizes, line, path, "increasing ints >= 1")
        if not sizes:
            raise _fail(line, path, "a non-empty list of increasing ints >= 1", sizes)
        previous = 0
        for i, size in enumerate(sizes):
            expected = f"an int > {previous} (strictly increasing)" if i else None
            previous = _int(size, line, f"{path}[{i}]", previous + 1, INT32_MAX, expected)
        out[mode] = list(sizes)
    return out


def parse_header(obj: Any, line: int = 1) -> TraceHeader:
    """The header line's object as a :class:`TraceHeader`; a :class:`TraceError` names the field.

    The format and version are checked first (another version's fields may differ), then unknown keys."""
    if not isinstance(obj, dict):
        raise _fail(line, "", "the header object", obj)
    if obj.get("format", _MISSING) != FORMAT:
        got = obj.get("format", _MISSING)
        hint = " (the header comes first)" if got is _MISSING and "step" in obj else ""
        raise _fail(line, "format", f'"{FORMAT}"{hint}', got)
    version = obj.get("version", _MISSING)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _fail(line, "version", f"the int {VERSION}", version)
    if version != VERSION:
        raise TraceError(f"line {line}: version {version}: this workbench reads version {VERSION}", line, "version")
    _object(obj, line, "", HEADER_FIELDS, "header")
    profile = obj.get("profile", _MISSING)
    if not isinstance(profile, str) or profile not in PROFILES:
        raise _fail(line, "profile", "one of " + ", ".join(f'"{p}"' for p in PROFILES), profile)
    layer = obj.get("layer", _MISSING)
    if not isinstance(layer, str) or layer not in LAYERS:
        raise _fail(line, "layer", "one of " + ", ".join(f'"{x}"' for x in LAYERS), layer)
    num_slots = _int(obj.get("num_slots", _MISSING), line, "num_slots", 2, INT32_MAX)
    buckets = _buckets(obj.get("buckets", _MISSING), line)
    draft_tokens = _int(obj.get("draft_tokens", TraceHeader.draft_tokens), line, "draft_tokens", 1, INT32_MAX)
    seed = obj.get("seed")
    if seed is not None:
        seed = _int(seed, line, "seed", 0, INT64_MAX, "an int >= 0 or null")
    engine = _engine(obj["engine"], line, profile) if "engine" in obj else None
    accepted = obj.get("accepted", TraceHeader.accepted)
    if not isinstance(accepted, str) or accepted not in ACCEPTED_UNITS:
        units = " or ".join(f'"{u}"' for u in ACCEPTED_UNITS)
        raise _fail(line, "accepted", f"{units} (what a verify row's accepted counts)", accepted)
    zero = obj.get("zero_on_alloc", False)
    if not isinstance(zero, bool):
        raise _fail(line, "zero_on_alloc", "true or false", zero)
    topk = _int(obj.get("topk", TraceHeader.topk), line, "topk", 1, INT32_MAX)
    if topk > 1 and not PROFILES[profile].tree_verify:
        expected = f'1 (profile "{profile}" has no tree drafts: vLLM removed them; topk > 1 is sglang\'s)'
        raise _fail(line, "topk", expected, topk)
    return TraceHeader(
        profile, layer, num_slots, buckets, draft_tokens, seed, engine=engine, accepted=accepted, zero_on_alloc=zero,
        topk=topk,
    )  # fmt: skip


def _release_text(value: Any, line: int, path: str, what: str) -> str:
    """A version or commit: visible ASCII (no space, no line break: it is quoted in one-line notes)."""
    if not isinstance(value, str) or not 1 <= len(value) <= 100 or not all("!" <= c <= "~" for c in value):
        raise _fail(line, path, f"{_RELEASE_TEXT} ({what})", value)
    return value


def _engine(value: Any, line: int, profile: str) -> TraceEngine:
    """``engine``: ``{name, version, commit?}``; ``name`` one of :data:`ENGINE_NAMES` and the profile's engine."""
    obj = _object(value, line, "engine", ENGINE_FIELDS, "engine")
    name = obj.get("name", _MISSING)
    if not isinstance(name, str) or name not in ENGINE_NAMES:
        raise _fail(line, "engine.name", "one of " + ", ".join(f'"{e}"' for e in ENGINE_NAMES), name)
    expected = PROFILES[profile].engine
    if name != expected:
        raise _fail(line, "engine.name", f'"{expected}" (the engine of profile "{profile}")', name)
    version = _release_text(obj.get("version", _MISSING), line, "engine.version", 'the release, like "0.5.23"')
    commit = obj.get("commit")
    if commit is not None:
        commit = _release_text(commit, line, "engine.commit", "the source commit, or null")
    return TraceEngine(name, version, commit)


# ----------------------------------------------------------------------------------------------------- steps


@dataclass
class ReadState:
    """What checks across lines need: the previous step number and the live request ids (id -> the line that
    admitted it). Its size is the number of requests live at once, not the file's length."""

    last_step: int | None = None
    live: dict[int, int] = field(default_factory=dict)


def _row(value: Any, line: int, path: str, mode: str, header: TraceHeader) -> TraceRow:
    """One row, its fields' ranges and its kind's token counts (a message's text is built only to refuse)."""
    obj = _object(value, line, path, ROW_FIELDS, "row")

    def get(name: str, minimum: int, maximum: int = INT32_MAX, expected: str | None = None) -> int:
        value = obj.get(name, _MISSING)
        if type(value) is int and minimum <= value <= maximum:
            return value
        return _int(value, line, f"{path}.{name}", minimum, maximum, expected)

    rid = get("id", 0, INT64_MAX)
    top = header.num_slots - 1
    slot = obj.get("slot", _MISSING)
    if not (type(slot) is int and 0 <= slot <= top):
        slot = get("slot", 0, top, f"an int in 0..{top} (num_slots = {header.num_slots})")
    req_pool_index = get("req_pool_index", 0)
    seq_len = get("seq_len", 1)
    new_tokens = get("new_tokens", 1)
    cached_tokens = get("cached_tokens", 0)
    kind = _kind(obj.get("kind"), line, path, mode, header)
    as_kind = kind or MODE_KINDS.get(mode)
    if as_kind == "decode" and new_tokens != 1:
        raise _fail(line, f"{path}.new_tokens", f"1 in {_where(mode, kind)}", new_tokens)
    if as_kind == "verify" and new_tokens != header.draft_tokens:
        expected = f"{header.draft_tokens} (draft_tokens) in {_where(mode, kind)}"
        raise _fail(line, f"{path}.new_tokens", expected, new_tokens)
    if mode in ("extend", "mixed") and seq_len != cached_tokens + new_tokens:
        expected = f"{cached_tokens + new_tokens} (cached_tokens {cached_tokens} + new_tokens {new_tokens})"
        raise _fail(line, f"{path}.seq_len", expected, seq_len)
    accepted = obj.get("accepted")
    if accepted is not None:
        accepted = _accepted(accepted, line, path, as_kind, _where(mode, kind), header)
    raw = obj.get("tokens")
    if isinstance(raw, list) and len(raw) != new_tokens:  # the count is said before any one id is
        raise _fail(line, f"{path}.tokens", f"{new_tokens} token ids (new_tokens)", raw, f"{len(raw)}")
    tokens = _ints(raw, line, f"{path}.tokens", 0, "token ids", "a token id (an int >= 0)")
    slots = _ints(
        obj.get("slots"), line, f"{path}.slots", 0, "slots", f"an int in 0..{top} (num_slots = {top + 1})", top
    )
    if slots is not None and (not slots or slots[0] != slot or len(set(slots)) != len(slots)):
        raise _fail(line, f"{path}.slots", f"distinct slots, the first the row's slot {slot}", obj["slots"])
    parents = "parents (one per fed token, the root's -1)"
    tree = _ints(obj.get("tree"), line, f"{path}.tree", -1, parents, "a parent node (an int >= 0, the root's -1)")
    return TraceRow(rid, req_pool_index, slot, seq_len, new_tokens, cached_tokens, accepted, tokens, slots, kind, tree)


def _where(mode: str, kind: str | None) -> str:
    """What a row's counts are checked against, for a message: its kind in a mixed step, else its step's mode."""
    return f"{_a(kind)} row" if mode == "mixed" and kind is not None else f"{_a(mode)} step"


def _ints(
    value: Any, line: int, path: str, minimum: int, what: str, expected: str, maximum: int = INT32_MAX
) -> tuple[int, ...] | None:
    """An optional list of ints in ``[minimum, maximum]`` as a tuple (None stays None): checked at once, and
    item by item only to say which one is refused."""
    if value is None:
        return None
    items = tuple(_list(value, line, path, what))
    if not _ints_within(items, minimum, maximum):
        for i, item in enumerate(items):
            _int(item, line, f"{path}[{i}]", minimum, maximum, expected)
    return items


def _kind(value: Any, line: int, path: str, mode: str, header: TraceHeader) -> str | None:
    """A row's ``kind``: null or absent (the mode says it), or one of ``ROW_KINDS`` that agrees with the mode;
    a verify row needs the header's target_verify buckets (its request owns a verify pool's slots)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in ROW_KINDS:
        raise _fail(line, f"{path}.kind", "one of " + ", ".join(f'"{k}"' for k in ROW_KINDS), value)
    if mode in MODE_KINDS and value != MODE_KINDS[mode]:
        raise _fail(line, f"{path}.kind", f'"{MODE_KINDS[mode]}" in {_a(mode)} step (or no kind)', value)
    if value == "verify" and "target_verify" not in header.buckets:
        raise _fail(line, f"{path}.kind", "a kind the header has buckets for (no buckets.target_verify)", value)
    return value


def _accepted(value: Any, line: int, path: str, kind: str | None, where: str, header: TraceHeader) -> int | None:
    """A row's ``accepted``: null, or (verify rows only) a count in the header's unit: tokens kept 1..D, or
    drafts accepted 0..D-1."""
    if value is None:
        return None
    if kind != "verify":
        raise _fail(line, f"{path}.accepted", f"null in {where} (only verify rows accept)", value)
    d = header.draft_tokens
    if header.accepted == "drafts":
        lowest, highest, meaning = 0, d - 1, "draft tokens accepted"
    else:
        lowest, highest, meaning = 1, d, "tokens kept, the bonus token included"
    expected = f'null or an int in {lowest}..{highest} ({meaning}: the header\'s accepted is "{header.accepted}")'
    return _int(value, line, f"{path}.accepted", lowest, highest, expected)


def _rows(value: Any, line: int, mode: str, header: TraceHeader) -> tuple[TraceRow, ...]:
    """The step's rows: none in an idle step, at least one elsewhere; ids, slots and pool rows unique; in a
    mixed step every row has its kind, or (a file written before rows had kinds) none has."""
    items = _list(value, line, "rows", "row objects")
    if mode == "idle" and items:
        raise _fail(line, "rows", "[] in an idle step", value, f"{len(items)} row{'s' * (len(items) > 1)}")
    if mode != "idle" and not items:
        raise _fail(line, "rows", f"at least one row in {_a(mode)} step (a step without rows is idle)", value)
    rows = tuple(_row(item, line, f"rows[{i}]", mode, header) for i, item in enumerate(items))
    for name in ("id", "slot", "req_pool_index"):
        seen: dict[int, int] = {}
        for i, row in enumerate(rows):
            v = getattr(row, name)
            if v in seen:
                raise _fail(
                    line, f"rows[{i}].{name}", f"{_a(name)} no other row of the step has (rows[{seen[v]}] has it)", v
                )
            seen[v] = i
    given = [i for i, row in enumerate(rows) if row.kind is not None]
    if mode == "mixed" and given and len(given) < len(rows):
        i = next(i for i, row in enumerate(rows) if row.kind is None)
        kinds = ", ".join(f'"{k}"' for k in ROW_KINDS)
        expected = f"one of {kinds} (every row of a mixed step has its kind once one has: rows[{given[0]}] has)"
        raise _fail(line, f"rows[{i}].kind", expected, _MISSING)
    return rows


def _ids(value: Any, line: int, path: str) -> tuple[int, ...]:
    """``admit`` / ``finish``: distinct request ids."""
    items = _list(value, line, path, "request ids")
    seen: set[int] = set()
    for i, item in enumerate(items):
        _int(item, line, f"{path}[{i}]", 0, INT64_MAX, "a request id (an int >= 0)")
        if item in seen:
            raise _fail(line, f"{path}[{i}]", f"an id not already in {path}", item)
        seen.add(item)
    return tuple(items)


def _int_list(
    value: Any, line: int, path: str, minimum: int = INT32_MIN, maximum: int = INT32_MAX, expected: str | None = None
) -> list[int]:
    for i, item in enumerate(_list(value, line, path, "ints")):
        _int(item, line, f"{path}[{i}]", minimum, maximum, expected)
    return value


def _slot(value: Any, line: int, path: str, num_slots: int, untracked: bool = False) -> int:
    """A slot of the pool: an int in ``[0, num_slots)`` (``untracked``: -1 too, sglang's "no track slot")."""
    lowest = -1 if untracked else 0
    what = f"a slot in [{lowest}, {num_slots - 1}] (the header's num_slots is {num_slots})"
    return _int(value, line, path, lowest, num_slots - 1, what)


def _slot_list(value: Any, line: int, path: str, num_slots: int, untracked: bool = False) -> list[int]:
    for i, item in enumerate(_list(value, line, path, "slots")):
        _slot(item, line, f"{path}[{i}]", num_slots, untracked)
    return value


def _lengths(bucket: int | None, n_rows: int, extra: int) -> tuple[int, ...]:
    return (n_rows + extra,) if bucket is None or bucket == n_rows else (n_rows + extra, bucket + extra)


def _expected_length(lengths: tuple[int, ...], what: str, rows: str = "the step's rows") -> str:
    return " or ".join(str(n) for n in lengths) + f" {what} ({rows}, or the bucket)"


def _metadata(value: Any, line: int, step: TraceStep, header: TraceHeader) -> dict[str, Any] | None:
    """``metadata``: null, or an object whose known fields are checked and other fields kept as they are
    (``step``: the step read so far, its rows and their kinds)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(line, "metadata", "an object or null", value)
    n_rows = len(step.rows)
    bucket = value.get("bucket")
    if bucket is not None:
        lowest = max(n_rows, 1)
        _int(bucket, line, "metadata.bucket", lowest, INT32_MAX, f"null or an int >= {lowest} (the step's rows)")
    if "state_indices" in value:
        if step.splits:
            expected = (
                "no state_indices in a mixed step with verify rows (its indices are spec_state_indices_tensor "
                "and non_spec_state_indices_tensor)"
            )
            raise _fail(line, "metadata.state_indices", expected, value["state_indices"])
        _state_indices(value["state_indices"], line, _lengths(bucket, n_rows, 0))
    if "query_start_loc" in value:
        _query_start_loc(value["query_start_loc"], line, _lengths(bucket, n_rows, 1))
    _split_keys(value, line, step.kinds, bucket, header.draft_tokens)
    _prefix_cache(value, line, header.num_slots, header.topk)
    for key in TREE_KEYS:
        if value.get(key) is not None and not PROFILES[header.profile].tree_verify:
            expected = f'nothing under profile "{header.profile}" (it has no tree verify; it commits by count)'
            raise _fail(line, f"metadata.{key}", expected, value[key])
    return value


def _split_keys(value: dict[str, Any], line: int, kinds: tuple[str, ...], bucket: int | None, d: int) -> None:
    """vLLM's split keys (``SPLIT_KEYS``): the verify rows' (``spec_*``) and the other rows' (``non_spec_*``)
    tensors, each null or as long as its rows (or the bucket), null where the step has no such rows;
    ``num_accepted_tokens`` one count in 1..D per verify row; the row counts ints >= 0. What they hold is
    checked by the replay."""
    n_spec = kinds.count("verify")
    parts = (("spec", n_spec, "verify rows"), ("non_spec", len(kinds) - n_spec, "rows other than verify rows"))
    for part, n, what in parts:
        for key, extra in ((f"{part}_state_indices_tensor", 0), (f"{part}_query_start_loc", 1)):
            if value.get(key) is None:
                continue
            if n == 0:
                raise _fail(line, f"metadata.{key}", f"null (the step has no {what})", value[key])
            check = _state_indices if extra == 0 else _query_start_loc
            check(value[key], line, _lengths(bucket, n, extra), key, f"the step's {what}")
    accepted = value.get("num_accepted_tokens")
    if accepted is not None:
        path = "metadata.num_accepted_tokens"
        if n_spec == 0:
            raise _fail(line, path, "null (the step has no verify rows)", accepted)
        lengths = _lengths(bucket, n_spec, 0)
        items = _list(accepted, line, path, "counts")
        if len(items) not in lengths:
            raise _fail(
                line, path, _expected_length(lengths, "counts", "the step's verify rows"), items, f"{len(items)}"
            )
        _int_list(items, line, path, 1, d, f"an int in 1..{d} (tokens the row's last verify kept)")
    for key in ("num_spec_decodes", "num_decodes", "num_prefills"):
        if key in value:
            _int(value[key], line, f"metadata.{key}", 0, INT32_MAX, "an int >= 0 (rows of the step)")


def _track_keys(value: dict[str, Any], line: int, num_slots: int, topk: int = 1) -> None:
    """sglang's track fields (``TRACK_FIELDS``, ``VERIFY_TRACK_FIELDS``, ``CHUNK_TRACK_FIELDS``): their types;
    their lengths and what they mean are checked by the replay. Under tree drafts (``topk > 1``) a
    ``mamba_steps_to_track`` entry may be below -1: a node read past the accepted path (its -1 padding, minus
    ``b * D``) is the replay's divergence (sglang PR 35821), not bad input."""
    if "mamba_track_mask" in value:
        for i, item in enumerate(_list(value["mamba_track_mask"], line, "metadata.mamba_track_mask", "bools")):
            if not (isinstance(item, bool) or (isinstance(item, int) and item in (0, 1))):
                raise _fail(line, f"metadata.mamba_track_mask[{i}]", "true or false (or 1 or 0)", item)
    if "mamba_track_indices" in value:
        _slot_list(value["mamba_track_indices"], line, "metadata.mamba_track_indices", num_slots, untracked=True)
    for key in ("mamba_track_seqlens", "mamba_steps_to_track"):
        if key in value:
            lowest = INT32_MIN if key == "mamba_steps_to_track" and topk > 1 else -1
            _int_list(value[key], line, f"metadata.{key}", lowest)
    for key in (*FINAL_TRACK_FIELDS, "track_ssm_h_dst", "track_ssm_recompute_dst"):  # slots
        if key in value:
            _slot_list(value[key], line, f"metadata.{key}", num_slots)
    for key in ("track_ssm_h_src", "track_ssm_seq_idx", "track_ssm_end_locs"):  # chunk, row, token positions
        if key in value:
            _int_list(value[key], line, f"metadata.{key}", 0)
    if "mamba_chunk_size" in value:
        _int(value["mamba_chunk_size"], line, "metadata.mamba_chunk_size", 1, INT32_MAX)
    if "track_conv_indices" in value:
        path = "metadata.track_conv_indices"
        for i, window in enumerate(_list(value["track_conv_indices"], line, path, "windows (lists of positions)")):
            _int_list(window, line, f"{path}[{i}]", 0)


def _prefix_cache(value: dict[str, Any], line: int, num_slots: int, topk: int = 1) -> None:
    """The prefix-cache keys (``PREFIX_KEYS``): their shapes, every slot inside the pool; what they mean is
    checked by the replay."""
    _track_keys(value, line, num_slots, topk)
    if "evict" in value:
        _slot_list(value["evict"], line, "metadata.evict", num_slots)
    for key in ("copies_before", "copies_after"):
        for i, pair in enumerate(_list(value.get(key, []), line, f"metadata.{key}", "[src, dst] pairs")):
            if not isinstance(pair, list) or len(pair) != 2:
                raise _fail(line, f"metadata.{key}[{i}]", "a [src, dst] pair of slots", pair)
            _slot_list(pair, line, f"metadata.{key}[{i}]", num_slots)
    for i, item in enumerate(_list(value.get("moves", []), line, "metadata.moves", "objects")):
        path = f"metadata.moves[{i}]"
        obj = _object(item, line, path, ("request", "slot", "slots", "keep"), "move")
        _int(obj.get("request", _MISSING), line, f"{path}.request", 0, INT64_MAX)
        if ("slot" in obj) == ("slots" in obj):
            raise _fail(line, path, "a move with one of slot (one slot per request) or slots (its window)", item)
        if "slot" in obj:
            _slot(obj["slot"], line, f"{path}.slot", num_slots)
        elif not _slot_list(obj["slots"], line, f"{path}.slots", num_slots):
            raise _fail(line, f"{path}.slots", "a non-empty list of slots (the request's window)", obj["slots"])
        if "keep" in obj:
            _slot_list(obj["keep"], line, f"{path}.keep", num_slots)
    for key in ("hits", "checkpoints"):
        for i, item in enumerate(_list(value.get(key, []), line, f"metadata.{key}", "objects")):
            path = f"metadata.{key}[{i}]"
            obj = _object(item, line, path, ("request", "tokens", "slot"), key[:-1])
            _int(obj.get("request", _MISSING), line, f"{path}.request", 0, INT64_MAX)
            _int(obj.get("tokens", _MISSING), line, f"{path}.tokens", 1, INT64_MAX)
            _slot(obj.get("slot", _MISSING), line, f"{path}.slot", num_slots)


def _state_indices(
    value: Any, line: int, lengths: tuple[int, ...], key: str = "state_indices", rows: str = "the step's rows"
) -> None:
    """A list of ints, or of equally long lists of ints (vLLM verify: ``[bs, D]``)."""
    path = f"metadata.{key}"
    items = _list(value, line, path, "ints or a list of lists of ints")
    if len(items) not in lengths:
        raise _fail(line, path, _expected_length(lengths, "entries", rows), items, f"{len(items)}")
    if items and isinstance(items[0], list):
        width = len(items[0])
        for i, item in enumerate(items):
            if not isinstance(item, list) or len(item) != width:
                raise _fail(line, f"{path}[{i}]", f"a list of {width} ints like {path}[0]", item)
            _int_list(item, line, f"{path}[{i}]")
    else:
        _int_list(items, line, path)


def _query_start_loc(
    value: Any, line: int, lengths: tuple[int, ...], key: str = "query_start_loc", rows: str = "the step's rows"
) -> None:
    """Token offsets: ints from 0, non-decreasing, one more than the rows (or the bucket)."""
    path = f"metadata.{key}"
    items = _list(value, line, path, "ints")
    if len(items) not in lengths:
        raise _fail(line, path, _expected_length(lengths, "offsets", rows), items, f"{len(items)}")
    previous = 0
    for i, item in enumerate(items):
        expected = "0" if i == 0 else f"an int >= {previous} (non-decreasing)"
        previous = _int(item, line, f"{path}[{i}]", previous, INT32_MAX if i else 0, expected)


def _cross_lines(step: TraceStep, line: int, state: ReadState) -> None:
    """Step numbers increase; an admitted id is not live already; a finished id is in the step or live."""
    if state.last_step is not None and step.step <= state.last_step:
        raise _fail(line, "step", f"an int > {state.last_step} (the previous step)", step.step)
    for i, rid in enumerate(step.admit):
        if rid in state.live:
            raise _fail(line, f"admit[{i}]", f"an id not live already (line {state.live[rid]} admitted it)", rid)
    in_rows = {row.id for row in step.rows}
    for i, rid in enumerate(step.finish):
        if rid not in in_rows and rid not in state.live and rid not in step.admit:
            raise _fail(line, f"finish[{i}]", "an id in this step's rows or admitted and not finished yet", rid)
    state.last_step = step.step
    for rid in step.admit:
        state.live[rid] = line
    for rid in step.finish:
        state.live.pop(rid, None)


def parse_step(obj: Any, line: int, header: TraceHeader, state: ReadState | None = None) -> TraceStep:
    """One step line's object as a :class:`TraceStep`; with ``state``, also the checks across lines (step
    numbers increase, admit and finish agree with the live ids), and ``state`` moves past this step."""
    if not isinstance(obj, dict):
        raise _fail(line, "", "a step object", obj)
    _object(obj, line, "", STEP_FIELDS, "step")
    number = _int(obj.get("step", _MISSING), line, "step", 0, INT64_MAX)
    mode = obj.get("mode", _MISSING)
    if not isinstance(mode, str) or mode not in STEP_MODES:
        raise _fail(line, "mode", "one of " + ", ".join(f'"{m}"' for m in STEP_MODES), mode)
    if mode == "target_verify" and "target_verify" not in header.buckets:
        raise _fail(line, "mode", "a mode the header has buckets for (no buckets.target_verify)", mode)
    rows = _rows(obj.get("rows", []), line, mode, header)
    admit = _ids(obj.get("admit", []), line, "admit")
    finish = _ids(obj.get("finish", []), line, "finish")
    step = TraceStep(number, mode, rows, admit, finish)
    step = TraceStep(number, mode, rows, admit, finish, _metadata(obj.get("metadata"), line, step, header))
    problem = tree_step_problem(step, header)  # the rows' trees against the verify outcome the step recorded
    if problem is not None:
        where, expected, got = problem
        raise _fail(line, where, expected, _MISSING if got is None else got)
    if state is not None:
        _cross_lines(step, line, state)
    return step


# ---------------------------------------------------------------------------------------------------- reading


def _header(records: _Records) -> TraceHeader:
    """The header from the first record; ``records`` is closed if it is refused."""
    try:
        first = next(records, None)
        if first is None:
            raise TraceError('line 1: expected the header ({"format": "linattn-trace", ...}), got an empty file', 1)
        return parse_header(first[1], first[0])
    except BaseException:
        records.close()
        raise


def open_trace(source: TraceSource) -> tuple[TraceHeader, StepReader]:
    """The header (read now) and a :class:`StepReader` of the steps (read as they are consumed: a long file is
    never held in memory). ``source``: a path (a ``str`` is always a path), or lines of text
    (``text.splitlines()``)."""
    records = _records(source)
    header = _header(records)
    return header, StepReader(records, header)


class StepReader:
    """The steps after the header, one line at a time, with the checks across lines; exhausting it, or
    ``close()`` (or ``with``), closes the file."""

    def __init__(self, records: _Records, header: TraceHeader) -> None:
        self.header = header
        self.state = ReadState()
        self._records = records

    def __iter__(self) -> StepReader:
        return self

    def __next__(self) -> TraceStep:
        try:
            number, obj = next(self._records)
            return parse_step(obj, number, self.header, self.state)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._records.close()

    def __enter__(self) -> StepReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_steps(source: TraceSource) -> Generator[TraceStep, None, None]:
    """The steps of a trace one by one, the header checked first (streaming; see :func:`open_trace`)."""
    _, steps = open_trace(source)
    with steps:
        yield from steps


def read_header(source: TraceSource) -> TraceHeader:
    """Only the header (the first non-blank line)."""
    records = _records(source)
    header = _header(records)
    records.close()
    return header


def read_trace(source: TraceSource) -> Trace:
    """A whole trace: a path or lines of text. Blank lines are skipped; every refusal is a TraceError naming
    the line and the field. A header alone reads as a trace of no steps (replaying it is the replayer's
    refusal, not the reader's)."""
    header, steps = open_trace(source)
    return Trace(header, list(steps))


# ---------------------------------------------------------------------------------------------------- writing


def header_dict(header: TraceHeader) -> dict[str, Any]:
    """The header line's object, in the file's key order; ``engine`` only when the header has one (files
    without it stay as they were), its ``commit`` only when known; ``accepted`` only when not ``"tokens"``,
    ``zero_on_alloc`` only when true, ``topk`` only when above 1."""
    out: dict[str, Any] = {
        "format": header.format,
        "version": header.version,
        "profile": header.profile,
        "layer": header.layer,
        "num_slots": header.num_slots,
        "buckets": {mode: list(sizes) for mode, sizes in header.buckets.items()},
        "draft_tokens": header.draft_tokens,
        "seed": header.seed,
    }
    if header.engine is not None:
        engine = header.engine
        out["engine"] = {"name": engine.name, "version": engine.version}
        if engine.commit is not None:
            out["engine"]["commit"] = engine.commit
    if header.accepted != TraceHeader.accepted:
        out["accepted"] = header.accepted
    if header.zero_on_alloc:
        out["zero_on_alloc"] = True
    if header.topk != TraceHeader.topk:
        out["topk"] = header.topk
    return out


def row_dict(row: TraceRow) -> dict[str, Any]:
    """A row's object; ``tokens``, ``slots``, ``kind`` and ``tree`` only when the row has them (files without
    stay as they were)."""
    out = {name: getattr(row, name) for name in ROW_FIELDS if name not in OPTIONAL_ROW_FIELDS}
    for name in OPTIONAL_ROW_FIELDS:
        value = getattr(row, name)
        if value is not None:
            out[name] = value if isinstance(value, str) else list(value)
    return out


def step_dict(step: TraceStep) -> dict[str, Any]:
    """A step line's object, in the file's key order (every key written, ``metadata`` null included)."""
    return {
        "step": step.step,
        "mode": step.mode,
        "rows": [row_dict(row) for row in step.rows],
        "admit": list(step.admit),
        "finish": list(step.finish),
        "metadata": step.metadata,
    }


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def dumps_header(header: TraceHeader) -> str:
    """The header as one compact JSON line (no newline)."""
    return _dumps(header_dict(header))


def dumps_step(step: TraceStep) -> str:
    """A step as one compact JSON line (no newline); ``parse_step`` of it gives the step back."""
    return _dumps(step_dict(step))


def write_trace(trace: Trace, path_or_file: str | os.PathLike[str] | IO[str], check: bool = True) -> None:
    """Write ``trace`` as JSON Lines to a path or an open text file. With ``check`` (the default) every line is
    read back through the reader first, so a file this writes always reads (a TraceError names the line)."""
    lines = [dumps_header(trace.header)] + [dumps_step(step) for step in trace.steps]
    if check:
        for _ in iter_steps(lines):
            pass
    text = "".join(line + "\n" for line in lines)
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        path_or_file.write(text)
