"""An unnamed operator's id: its label made safe for file names, and a digest of what makes
the operator what it is (see :mod:`cutline.api.streams`)."""

from __future__ import annotations

import hashlib
import json
import linecache
import re
import types
from collections.abc import Sequence
from typing import Any

from cutline.runtime.graph import Edge, KeySelector
from cutline.runtime.operators import function_name

_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")


def operator_id(label: str, inputs: Sequence[Edge], detail: str = "") -> str:
    """The id of an unnamed operator: ``label`` made safe (at most 40 characters), then 8 hex
    digits of a digest of the label, ``detail`` (what a source reads; what tells a lambda
    from another) and the inputs (their ids, partitioning, key and port, in any order). Nothing
    else of the job goes into it."""
    readable = _UNSAFE.sub("_", label).strip("_.")[:40].rstrip("_.") or "operator"
    edges = sorted(
        [e.upstream, e.partitioning, _key_name(e.key), *([e.port] if e.port else [])]
        for e in inputs
    )
    identity = json.dumps([label, detail, edges])
    return f"{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def _key_name(key: KeySelector | None) -> str:
    if key is None or isinstance(key, str):
        return key or ""
    return f"{function_name(key)}({lambda_text(key)})"


def lambda_text(fn: Any) -> str:
    """What tells a lambda (a function without a name) from another: the text of its code
    without blanks (``m["kind"]=="label"``, from its source file), else the constants and
    names in it; not its bytecode, which changes with the version of Python. Empty for a
    function with a name: its name is its identity, whatever its body."""
    code = getattr(fn, "__code__", None)
    if function_name(fn) != "lambda" or not isinstance(code, types.CodeType):
        return ""
    return _text(code) or _names(code)


def _text(code: types.CodeType) -> str:
    """The source text of ``code`` without blanks; empty when its file cannot be read."""
    spans = [
        (line, end_line, col, end)
        for line, end_line, col, end in code.co_positions()
        if line is not None
        and end_line is not None
        and col is not None
        and end is not None
        and (line, col) != (end_line, end)  # (the frame's set-up: no text)
    ]
    lines = linecache.getlines(code.co_filename)
    if not spans or not lines:
        return ""
    first, col = min((p[0], p[2]) for p in spans)
    last, end = max((p[1], p[3]) for p in spans)
    text = [line.encode() for line in lines[first - 1 : last]]  # columns count UTF-8 bytes
    if not text:
        return ""
    text[-1] = text[-1][:end]
    text[0] = text[0][col:]
    return "".join(b"".join(text).decode(errors="replace").split())


def _names(code: types.CodeType) -> str:
    constants = [
        _names(c) if isinstance(c, types.CodeType) else repr(c)
        for c in code.co_consts
        if c is not None
    ]
    return f"{constants} {list(code.co_names)} {list(code.co_varnames)}"
