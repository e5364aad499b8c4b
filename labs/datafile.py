"""YAML data files read strictly: duplicate keys refused, every error as `file:line: field: message`.

PyYAML's `safe_load` keeps the last of two equal keys, reads a typo'd key as just
another key, and raises bare `ValueError`s (a date such as 2026-13-45) that name
no line. Every YAML file the project reads, the labs' data and the site's
question bank alike, goes through `load` here instead, so each mistake is
reported once, in the same words, at the line to fix.

`build(cls, node, doc)` turns a mapping into a frozen dataclass: each field is
checked against its annotation (int, float, str, bool, None, unions, tuples,
lists, dicts, Literal, nested dataclasses), unknown keys are refused with the
closest known name, and an error from the record's own `__post_init__` is
reported at the record's line. Standard library and PyYAML only: the labs run on
machines without pydantic (the site build validates its own files with pydantic,
on top of `load`).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_ENTRIES = 200_000  # keys and list items in one file; vllm.yaml, the largest, has ~2,000


# A float annotation that also takes inf and NaN (`.inf` is a real default: "send all at once").
FLOAT_OR_INF = typing.Annotated[float, "non-finite allowed"]


class DataError(ValueError):
    """A data file is wrong; the message reads `file:line: field: message`."""

    def __init__(self, file: str | None, line: int | None, field: str | None, message: str):
        self.file, self.line, self.field, self.message = file, line, field, message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file or ""
        if self.line is not None:
            where = f"{where}:{self.line}"
        parts = [p for p in (where, f"field '{self.field}'" if self.field else "", self.message) if p]
        return ": ".join(parts)


def field_name(path: tuple) -> str:
    """A location as a reader writes it: ``follow_ups[0].a``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Document:
    """A loaded file: its data and the line of every key and list item."""

    file: str
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)
    text: str = field(default="", repr=False)  # the source, for errors found later inside a value

    def line(self, path: tuple = ()) -> int:
        """The line of `path`, or of its nearest ancestor the file has (1 for the whole file)."""
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: tuple, message: str) -> DataError:
        return DataError(self.file, self.line(path), field_name(path) or None, message)


# libyaml's parser where PyYAML was built with it: the site build reads every data file on every build.
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE):
    """SafeLoader that refuses duplicate keys and says where a timestamp is impossible."""

    file = "<string>"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges are overridden by design
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise DataError(self.file, key_node.start_mark.line + 1, None,
                                    "a mapping key must be a plain value, not a list or mapping") from None
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DataError(self.file, line, str(key),
                                    f"duplicate key (first given on line {seen[key]}); YAML would keep only the last")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_timestamp(self, node):
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError as exc:
            raise DataError(self.file, node.start_mark.line + 1, None,
                            f"{node.value!r} is not a real date ({exc}); write YYYY-MM-DD") from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)


def _record_lines(loader: _Loader, node, path: tuple, lines: dict[tuple, int], at: dict[int, tuple],
                  depth: int = 0) -> None:
    """The line of every key and list item, by its path. Aliased nodes are walked once per use."""
    if depth > 50 or len(lines) > MAX_ENTRIES:  # far past any data file: aliases expanding, or a hostile file
        raise DataError(None, node.start_mark.line + 1, field_name(path),
                        f"more than 50 levels deep or {MAX_ENTRIES:,} entries (are aliases expanding?)")
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a bad key is refused by the constructor, with its line
            # The key as the data will hold it: `1:` is the int 1, `"1":` the text "1".
            key = key_node.value if key_node.tag == "tag:yaml.org,2002:str" else loader.construct_object(key_node)
            lines.setdefault((*path, key), key_node.start_mark.line + 1)
            at.setdefault(key_node.start_mark.line + 1, (*path, key))
            _record_lines(loader, value_node, (*path, key), lines, at, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault((*path, i), item.start_mark.line + 1)
            at.setdefault(item.start_mark.line + 1, (*path, i))
            _record_lines(loader, item, (*path, i), lines, at, depth + 1)


def loads(text: str, file: str = "<string>") -> Document:
    """Parse one YAML document; a syntax error, a duplicate key or an impossible date is a DataError."""
    loader = _Loader(text)
    loader.file = file
    at: dict[int, tuple] = {}  # line -> the first key or item on it, to name a field in an error
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(file, None, {}, text)
        lines: dict[tuple, int] = {(): node.start_mark.line + 1}
        _record_lines(loader, node, (), lines, at)
        data = loader.construct_document(node)
    except DataError as exc:
        where = at.get(exc.line) if exc.line is not None else None
        raise DataError(exc.file or file, exc.line, field_name(where) if where else exc.field, exc.message) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = exc.problem or exc.context
        if what == "found character that cannot start any token" and mark is not None:  # libyaml omits which
            row = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
            if mark.column < len(row):
                what = f"found character {row[mark.column]!r} that cannot start any token"
        if "'\\t'" in what or "tab character" in what:  # the two parsers word it differently
            raise DataError(file, line, None, "YAML syntax error: a tab character; indent with spaces") from None
        if exc.context and exc.problem and exc.context_mark and exc.problem_mark:
            if exc.context_mark.line != exc.problem_mark.line:
                what += f" ({exc.context} that starts on line {exc.context_mark.line + 1})"
        raise DataError(file, line, None, f"YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise DataError(file, None, None, f"YAML error: {exc}") from None
    except RecursionError:
        raise DataError(file, None, None, "nested too deeply to read") from None
    finally:
        loader.dispose()
    return Document(file, data, lines, text)


def load(path: str | Path, display: str | None = None) -> Document:
    """Read and parse a file; `display` is the name errors give it (default: the path as given)."""
    path = Path(path)
    name = display or str(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(name, None, None, "is a folder, not a file") from None
    except OSError as exc:
        raise DataError(name, None, None, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(name, line, None, f"not UTF-8: byte 0x{raw[exc.start]:02x} cannot be decoded; "
                                          "save the file as UTF-8") from None
    return loads(text, name)


# ---------------------------------------------------------------------------
# Typed records
# ---------------------------------------------------------------------------


def _type_name(tp) -> str:
    names = {int: "an integer", float: "a number", str: "text", bool: "true or false", type(None): "null",
             dict: "a mapping", list: "a list", tuple: "a list"}
    if tp in names:
        return names[tp]
    if tp == FLOAT_OR_INF:
        return "a number"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def convert(tp, value, doc: Document, path: tuple):
    """`value` checked against the annotation `tp` (see the module docstring); a DataError if it does not fit."""
    if tp is Any:
        return value
    if tp == FLOAT_OR_INF:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise doc.error(path, f"expected a number, got {_shown(value)}")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        first = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(arg, value, doc, path)
            except DataError as exc:
                first = first or exc
        if first is not None and len([a for a in args if a is not type(None)]) == 1:
            raise first
        raise doc.error(path, f"expected {_type_name(tp)}, got {_shown(value)}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise doc.error(path, f"expected {_type_name(tp)}, got {_shown(value)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise doc.error(path, f"expected a list, got {_shown(value)}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        out = [convert(item, v, doc, (*path, i)) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise doc.error(path, f"expected a mapping, got {_shown(value)}")
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        return {convert(key_tp, k, doc, (*path, k)): convert(value_tp, v, doc, (*path, k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, doc, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise doc.error(path, f"expected true or false, got {_shown(value)}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise doc.error(path, f"expected an integer, got {_shown(value)}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise doc.error(path, f"expected a finite number, got {_shown(value)}")
        return value  # an int stays an int: 80 GB prints as 80, not 80.0
    if tp is str:
        if not isinstance(value, str):
            raise doc.error(path, f"expected text, got {_shown(value)}"
                            + (" (quote it: YAML read it as a number)" if isinstance(value, (int, float)) else ""))
        return value
    if tp in (datetime.date, datetime.datetime):
        if not isinstance(value, tp):
            raise doc.error(path, f"expected a date (YYYY-MM-DD), got {_shown(value)}")
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise doc.error(path, f"expected {_type_name(tp)}, got {_shown(value)}")
        return value
    raise TypeError(f"datafile.convert does not know the annotation {tp!r}")


def build(cls, value, doc: Document, path: tuple = (), **given):
    """A `cls` dataclass from the mapping at `path`; `given` fills fields the file does not hold (a name from its key)."""
    if not isinstance(value, dict):
        raise doc.error(path, f"expected a mapping of fields, got {_shown(value)}")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in given}
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.75)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known fields: {', '.join(fields)}"
            raise doc.error((*path, key), f"unknown field{hint}")
    kwargs = dict(given)
    for name, f in fields.items():
        if name in value:
            kwargs[name] = convert(hints[name], value[name], doc, (*path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise doc.error(path, f"missing field '{name}'")
    try:
        return cls(**kwargs)
    except DataError:
        raise
    except (ValueError, TypeError) as exc:  # the record's own __post_init__ checks
        raise doc.error(path, str(exc)) from None
