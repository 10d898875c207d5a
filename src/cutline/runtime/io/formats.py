"""What file input is: its formats, its options (:class:`CsvOptions`), the schema a user gives
(:func:`as_schema`), and the errors and warnings that name a file and a line."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from cutline.connectors.source import SourceError as SourceError  # (its home: connectors)

FORMATS = ("parquet", "csv", "jsonl")

SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json")}

BLOCK_BYTES = 1 << 20
"""Bytes of a CSV or JSON-lines file parsed at once (whole records: more for a longer one)."""

SAMPLE_BYTES = 1 << 20
"""Schema inference reads at most this much of the head of every file..."""

SAMPLE_ROWS = 10_000
"""... and at most this many rows of it..."""

SAMPLE_TOTAL = 256 << 20
"""... and, with many files, this much in all (shared out evenly)..."""

SAMPLE_LEAST = 64 << 10
"""... but never less than this per file."""


class InputWarning(UserWarning):
    """What a file source's user should know when the job is built: no input files, a column
    read as text because its values mix numbers and text."""


@dataclass(frozen=True)
class CsvOptions:
    """How CSV files are written: the separator, the header, the quote, the null values."""

    delimiter: str = ","
    header: bool = True
    """Whether each file's first record names its columns (it is never read as data)."""
    quote: str | None = '"'
    """Quotes a value that holds the delimiter, a line break or a quote (doubled inside);
    ``None``: no quoting."""
    null_values: tuple[str, ...] = ("",)
    """Fields that read as null (quoted or not): by default the empty field only."""
    column_names: tuple[str, ...] | None = None
    """The columns' names, in the order of the fields (replacing the header's, if any)."""

    def __post_init__(self) -> None:
        for what, value in (("delimiter", self.delimiter), ("quote", self.quote)):
            if value is None and what == "quote":
                continue
            if not isinstance(value, str) or len(value.encode()) != 1 or value in "\r\n":
                raise ValueError(
                    f"{what} must be one ASCII character other than a line break, not {value!r}"
                )
        if self.quote == self.delimiter:
            raise ValueError(f"the quote and the delimiter are both {self.delimiter!r}")
        if type(self.header) is not bool:
            raise ValueError(f"header must be True or False, not {self.header!r}")
        nulls = self.null_values
        if isinstance(nulls, str | bytes) or not all(isinstance(v, str) for v in nulls):
            raise ValueError(f"null_values must be a list of strings, not {nulls!r}")
        object.__setattr__(self, "null_values", tuple(nulls))
        names = self.column_names
        if names is not None:
            if isinstance(names, str | bytes) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"column_names must be a list of strings, not {names!r}")
            if not names:
                raise ValueError("column_names must name at least one column")
            twice = first_duplicate(names)
            if twice is not None:
                raise ValueError(f"column_names names {twice!r} twice")
            object.__setattr__(self, "column_names", tuple(names))


_TYPE_NAMES = {
    "int": pa.int64(),
    "integer": pa.int64(),
    "long": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "text": pa.string(),
    "date": pa.date32(),
    "datetime": pa.timestamp("us"),
    "timestamp": pa.timestamp("us"),
}
"""Names of types that pyarrow does not know by them (looked up in lower case)."""

_TIMESTAMP = re.compile(
    r"timestamp\s*\[\s*(?P<unit>s|ms|us|ns)\s*(?:,\s*tz\s*=\s*(?P<tz>[^\]]*?)\s*)?\]",
    re.IGNORECASE,
)
"""A timestamp type as ``str(pa.timestamp(...))`` spells it, spaces aside:
``timestamp[ms]``, ``timestamp[us, tz=UTC]``, ``timestamp[ns, tz=+02:00]``."""

_OFFSET = re.compile(r"[+-]\d\d:\d\d")

_TYPE_EXAMPLES = (
    "'string', 'int64', 'double', 'bool', 'date32', 'timestamp[ms]', "
    "'timestamp[us, tz=UTC]', 'timestamp[ns, tz=Europe/Paris]'"
)


def as_schema(value: Any) -> pa.Schema | None:
    """``schema=`` as a ``pyarrow.Schema``: one as it is, or a dict of column -> type (a
    pyarrow type, or its name: ``"string"``, ``"int64"``, ``"double"``, ``"bool"``,
    ``"date32"``, every timestamp type as pyarrow spells it, ``"timestamp[ms]"``,
    ``"timestamp[us, tz=UTC]"``, ``"timestamp[ns, tz=+02:00]"``, ...; also ``"int"``,
    ``"float"``, ``"str"``). The file sources take a dict as the types of the columns it
    names only (:class:`~cutline.runtime.io.sources.FileSource`)."""
    if value is None or isinstance(value, pa.Schema):
        if value is not None:
            twice = first_duplicate(value.names)
            if twice is not None:
                raise ValueError(f"schema: column {twice!r} is named twice")
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            "schema must be a pyarrow.Schema or a dict of column -> type, not "
            f"{type(value).__name__}"
        )
    if not value:
        raise ValueError("schema: give at least one column")
    fields = []
    for name, kind in value.items():
        if not isinstance(name, str):
            raise ValueError(f"schema: column names are strings, not {name!r}")
        fields.append(pa.field(name, _as_type(name, kind)))
    return pa.schema(fields)


def _as_type(name: str, kind: Any) -> pa.DataType:
    """The type ``kind`` of column ``name`` in a ``schema=`` dict: a pyarrow type, or its
    name (see :func:`as_schema`); an unknown one is a ``ValueError`` naming the column, what
    was given and names that work."""
    if isinstance(kind, pa.DataType):
        return kind
    if isinstance(kind, str):
        text = kind.strip()
        found = _TYPE_NAMES.get(text.lower())
        if found is not None:
            return found
        stamp = _TIMESTAMP.fullmatch(text)
        if stamp is not None:
            return pa.timestamp(stamp["unit"].lower(), _time_zone(name, kind, stamp["tz"]))
        try:
            return pa.type_for_alias(text)
        except ValueError:
            pass
    raise ValueError(
        f"schema: column {name!r} has the unknown type {kind!r} (use a pyarrow type, or a "
        f"name like {_TYPE_EXAMPLES})"
    )


def _time_zone(name: str, kind: str, zone: str | None) -> str | None:
    """The time zone of a timestamp type string: ``UTC``, an offset (``+02:00``) or a name
    of the tz database (``Europe/Paris``), checked now (Arrow would only refuse it when the
    records are made)."""
    if zone is None:
        return None
    if zone.upper() in ("UTC", "Z"):
        return "UTC"
    if _OFFSET.fullmatch(zone):
        return zone
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"schema: column {name!r} has the type {kind!r}, whose time zone {zone!r} is "
            "unknown (use 'UTC', an offset like '+02:00' or a name of the tz database like "
            "'Europe/Paris': 'timestamp[us, tz=UTC]')"
        ) from None
    return zone


def first_duplicate(names: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


class FileInput(Protocol):
    """What the format readers and the schema inference need of a file source
    (:class:`~cutline.runtime.io.sources.FileSource` is one)."""

    @property
    def format(self) -> str: ...

    @property
    def csv(self) -> CsvOptions: ...

    @property
    def block_size(self) -> int: ...

    @property
    def schema(self) -> pa.Schema | None: ...

    @property
    def types(self) -> pa.Schema | None:
        """The columns whose types the user set (``schema=`` as a dict), the others inferred."""
        ...

    def filesystem(self) -> tuple[Any, str]:
        """The file system of the input, and its path on it."""
        ...
