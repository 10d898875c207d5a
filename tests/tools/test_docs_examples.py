"""Every Python block of README.md and of the documentation's pages runs as it is written there
(``tests/docs_examples.py`` finds them and reads what each needs): in a folder of its own,
with the inputs it names made first, its jobs with the slots as threads. A block that needs
servers is run by the connectors' tests (``docs_example(NAME)``); one that cannot run (a
fragment, a job for a cluster) is skipped here with its reason, so that the skips are listed
with the rest of the run's."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from docs_examples import ROOT, Example, examples, page_examples, pages, programs, run_example

pytestmark = pytest.mark.tools


def _events(folder: Path) -> None:
    """``events/``: two Parquet files of 500 rows, ``key`` (10 keys) and ``value``."""
    (folder / "events").mkdir()
    for part in range(2):
        rows = range(part * 500, (part + 1) * 500)
        table = pa.table({"key": [f"k{i % 10}" for i in rows], "value": list(rows)})
        pq.write_table(table, folder / "events" / f"part-{part}.parquet")


def _jsonl(folder: Path, name: str, files: list[list[dict[str, object]]]) -> None:
    (folder / name).mkdir()
    for i, rows in enumerate(files):
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        (folder / name / f"part-{i}.jsonl").write_text(lines)


T0 = 1_700_000_000_000
"""The event time the inputs start at (epoch milliseconds: 2023-11-14 22:13:20 UTC)."""


def _clicks(folder: Path) -> None:
    """``clicks/``: two JSON-lines files of 300 clicks over ten minutes, ``user`` (five),
    ``ts`` (epoch ms, at most a second out of order) and ``amount``."""
    rng = random.Random(7)
    files = []
    for _file in range(2):
        times = [T0 + i * 2_000 + rng.randrange(-1_000, 1_000) for i in range(300)]
        files.append(
            [
                {"user": ["ann", "bob", "cho", "dev", "eve"][i % 5], "ts": t, "amount": i % 7}
                for i, t in enumerate(times)
            ]
        )
    _jsonl(folder, "clicks", files)


def _payments(folder: Path) -> None:
    """``payments/``: ``card``, ``amount``, ``merchant``; card c1 pays 10 a time, then 500."""
    rows = [{"card": f"c{i % 3}", "amount": 10, "merchant": f"m{i % 4}"} for i in range(30)]
    rows.append({"card": "c1", "amount": 500, "merchant": "m9"})
    _jsonl(folder, "payments", [rows])


def _orders(folder: Path) -> None:
    """``orders/``: an order each of o0..o9 at ``ts``, the even ones paid ten minutes later,
    and a last record two hours on (so that the reminders of the others are due)."""
    rows = [{"kind": "order", "order": f"o{i}", "ts": T0 + i * 1_000} for i in range(10)]
    rows += [{"kind": "paid", "order": f"o{i}", "ts": T0 + 600_000 + i} for i in range(0, 10, 2)]
    rows.append({"kind": "paid", "order": "o-late", "ts": T0 + 7_200_000})
    _jsonl(folder, "orders", [rows])


def _ads(folder: Path) -> None:
    """``ads/views/`` and ``ads/clicks/``: JSON lines over ten minutes of three ads, ``ad``,
    ``ts`` (epoch ms, at most a second out of order, no two views of an ad at one time) and
    ``view`` or ``click`` (its id): two files of 150 views, one of 60 clicks (ad ``c`` is
    never viewed, so that its clicks find no view)."""
    rng = random.Random(11)
    (folder / "ads").mkdir()
    views = []
    for part in range(2):
        times = [T0 + i * 4_000 + part * 2_000 + rng.randrange(-1_000, 1_000) for i in range(150)]
        views.append(
            [{"ad": "ab"[i % 2], "ts": t, "view": f"v{part}-{i}"} for i, t in enumerate(times)]
        )
    clicks = [
        {"ad": "abc"[i % 3], "ts": T0 + i * 10_000 + rng.randrange(-1_000, 1_000), "click": f"c{i}"}
        for i in range(60)
    ]
    _jsonl(folder, "ads/views", views)
    _jsonl(folder, "ads/clicks", [clicks])


def _rules(folder: Path) -> None:
    """``rules/``: per merchant of ``payments/`` a limit, some twice (a later ``version``
    lowers it), in two files: which a subtask reads first is not known."""
    rules = [{"merchant": f"m{i}", "limit": 100, "version": 1} for i in range(4)]
    rules.append({"merchant": "m9", "limit": 200, "version": 1})
    updates = [
        {"merchant": "m1", "limit": 5, "version": 2},
        {"merchant": "m9", "limit": 300, "version": 2},
    ]
    _jsonl(folder, "rules", [rules, updates])


INPUTS: dict[str, Callable[[Path], None]] = {
    "events": _events,
    "clicks": _clicks,
    "payments": _payments,
    "orders": _orders,
    "ads": _ads,
    "rules": _rules,
}
"""What a block marked ``<!-- test: with NAME -->`` finds in its folder."""

HERE = [p for p in programs() if p.mode in ("run", "with", "skip")]


@pytest.mark.parametrize("example", HERE, ids=[p.where for p in HERE])
def test_the_example_runs(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example.mode == "skip":
        pytest.skip(f"{example.where}: {example.argument}")
    for name in example.inputs:
        INPUTS[name](tmp_path)
    run_example(example, tmp_path, monkeypatch)


def test_every_block_is_run_here_or_elsewhere_or_skipped_with_its_reason() -> None:
    """Each ``with`` names inputs made here; each ``elsewhere NAME`` is one block's, run by a
    test module that asks for it by that name."""
    found = examples()
    for example in found:
        unknown = [name for name in example.inputs if name not in INPUTS]
        assert not unknown, f"{example.where}: no input named {unknown} (inputs: {sorted(INPUTS)})"
    names = [e.argument for e in found if e.mode == "elsewhere"]
    assert len(names) == len(set(names)), f"an 'elsewhere' name is on two blocks: {names}"
    tests = "".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    unclaimed = [name for name in names if f'docs_example("{name}")' not in tests]
    assert not unclaimed, f"no test runs the blocks marked 'elsewhere' {unclaimed}"
    assert len(found) >= 20 and any(p.name == "README.md" for p in pages())


def test_a_mark_that_is_not_one_is_an_error_naming_the_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# a page\n\n<!-- test: sometimes -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match=r"page.md:3: a block's mark must be"):
        page_examples(page)
    page.write_text("<!-- test: skip -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="with its argument"):
        page_examples(page)
    page.write_text("<!-- test: with clicks -->\n```python\npass\n```\n")
    assert page_examples(page)[0].inputs == ["clicks"]


def test_the_readme_stays_a_front_page() -> None:
    """The README is what cutline is, the two commands, a job, the guarantees, three benchmark
    headlines and links; the rest is in the documentation, where it is kept once."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "```sh\nmake demo\nmake test\n```" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README.md links to {link}, which is not there"
