"""The Python blocks of ``README.md`` and of the documentation's pages (``docs/**/*.md``), as
they are written there, and what each needs to run.

A comment just before a block says what it needs, when it needs something:

* none: it runs as it is, in a folder of its own;
* ``<!-- test: with clicks, events -->``: it runs once those inputs are made in its folder
  (``tests/tools/test_docs_examples.py`` makes them);
* ``<!-- test: continues -->``: it runs after the block before it on its page, as one program;
* ``<!-- test: elsewhere NAME -->``: another test runs it (it needs servers, or its result is
  checked): :func:`docs_example` gives that test the block by its name;
* ``<!-- test: skip WHY -->``: it does not run (a fragment, a job for a cluster).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODES = ("run", "with", "continues", "elsewhere", "skip")
_FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
_MARK = re.compile(r"<!-- test: (\w+)\b *(.*?) *-->\n\Z")


@dataclass(frozen=True)
class Example:
    """One Python block: where it is, its code, and what it needs (``mode``, ``argument``)."""

    page: str
    line: int
    code: str
    mode: str
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def inputs(self) -> list[str]:
        """The inputs a ``with`` block needs made first."""
        return [name.strip() for name in self.argument.split(",")] if self.mode == "with" else []


def pages() -> list[Path]:
    """README.md and every page of the documentation (not the built site)."""
    docs = ROOT / "docs"
    found = [p for p in docs.rglob("*.md") if "_build" not in p.relative_to(docs).parts]
    return [ROOT / "README.md", *sorted(found)]


def page_examples(page: Path) -> list[Example]:
    """The Python blocks of ``page``, in order; a mark that is not one of :data:`MODES`, or a
    mode that needs an argument without one, is an error naming the page and the line."""
    text = page.read_text()
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name
    found = []
    for fence in _FENCE.finditer(text):
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()]
        mark = _MARK.search(before[before.rfind("\n", 0, len(before) - 1) + 1 :])
        mode, argument = (mark.group(1), mark.group(2)) if mark else ("run", "")
        if mode not in MODES or (mode in ("with", "elsewhere", "skip") and not argument):
            raise ValueError(
                f"{name}:{line - 1}: a block's mark must be one of {MODES} (with its argument)"
            )
        found.append(Example(name, line, fence.group(1), mode, argument))
    return found


def examples() -> list[Example]:
    """Every Python block of the README and the documentation."""
    return [example for page in pages() for example in page_examples(page)]


def programs() -> list[Example]:
    """The blocks as they run: each ``continues`` block joined to the one before it."""
    joined: list[Example] = []
    for example in examples():
        if example.mode == "continues":
            before = joined[-1]
            if before.page != example.page:
                raise ValueError(f"{example.where}: continues no block of its page")
            code = before.code + "\n" + example.code
            joined[-1] = Example(before.page, before.line, code, before.mode, before.argument)
        else:
            joined.append(example)
    return joined


def docs_example(name: str) -> Example:
    """The block marked ``<!-- test: elsewhere NAME -->``."""
    found = [e for e in examples() if e.mode == "elsewhere" and e.argument == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} blocks are marked 'elsewhere {name}', not 1")
    return found[0]


def run_example(
    example: Example | str,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    before: Callable[[dict[str, Any]], None] | None = None,
    **lines: str,
) -> dict[str, Any]:
    """Run an example in ``folder``, its jobs with the slots as threads and no live display,
    each ``name = ...`` line of it replaced by ``name = lines[name]`` (the address of a
    server the test started); ``before`` is given its namespace first. Its namespace."""
    code, where = (
        (example.code, example.where) if isinstance(example, Example) else (example, "<example>")
    )
    for name, value in lines.items():
        code, found = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", code, flags=re.M)
        assert found == 1, f"{where}: the example has no line '{name} = ...'"
    from cutline import StreamEnvironment, testing

    def on_threads(self: StreamEnvironment, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("progress", False)
        return testing.execute(self, *args, launcher=testing.ThreadLauncher(), **kwargs)

    monkeypatch.setattr(StreamEnvironment, "execute", on_threads)
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    if before is not None:
        before(namespace)
    exec(compile(code, where, "exec", dont_inherit=True), namespace)
    return namespace
