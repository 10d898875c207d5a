"""How the window stores are built (issue 36): a store never sees its operator, and is one
bucketing kept in one storage, by composition.

* no module of ``runtime/eventtime/`` but the logic imports ``operator.py``, and none imports
  ``keyed_operators.py``;
* a store of every layout, made by the operator, holds no reference to it (nor does anything
  it holds: its bucketing, its storage, its context);
* no store class inherits from more than one class of the house (no diamond), and the
  layouts pair each bucketing with its storage.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cutline.runtime.eventtime import (
    bucketing,
    by_start,
    columnar_sessions,
    columnar_windows,
    keyed,
    run_windows,
    sliced_runs,
    sliced_windows,
)
from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.logic import Storage, WindowLogic
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.operators import OperatorContext
from cutline.runtime.state.config import StateConfig

EVENTTIME = Path(inspect.getfile(keyed)).parent


def imported(path: Path) -> set[str]:
    """The modules a file imports (absolute names)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_store_imports_the_operator_and_nothing_here_imports_keyed_operators() -> None:
    importers = {
        path.name
        for path in EVENTTIME.glob("*.py")
        if "cutline.runtime.eventtime.operator" in imported(path)
    }
    assert importers == {"logic.py"}
    assert not [
        path.name
        for path in EVENTTIME.glob("*.py")
        if "cutline.runtime.keyed_operators" in imported(path)
    ]


def reachable(root: Any) -> list[Any]:
    """Every object reachable from ``root`` through instance attributes (and the containers
    they hold), without descending into Arrow or NumPy data."""
    seen: set[int] = set()
    found: list[Any] = []
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, str | bytes | int | float | pa.Array | type):
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, dict):
            todo += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            todo += list(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("cutline."):
            todo += list(vars(obj).values())
    return found


@pytest.mark.parametrize("backend", ["memory", "disk"])
@pytest.mark.parametrize("assigner", [Tumbling(10), Sliding(20, 10), Session(5)])
@pytest.mark.parametrize("aggregation", ["sum", "reduce"])
def test_a_store_holds_no_reference_to_its_operator(
    backend: str, assigner: Any, aggregation: str, tmp_path: Path
) -> None:
    agg = (
        Aggregation("sum", "n")
        if aggregation == "sum"
        else Aggregation("reduce", fn=lambda a, b: {**a, "n": a["n"] + b["n"]})
    )
    logic = WindowLogic(assigner, agg, "user", TimeColumn("ts", 0, pa.int64()), 5)
    ctx = OperatorContext(
        "w", 0, 1, 128, 1, state=StateConfig(backend=backend, local_dir=str(tmp_path))
    )
    op = logic.open(ctx, None)
    assert isinstance(op, WindowOperator)
    op.process(pa.RecordBatch.from_pylist([{"user": "a", "ts": 3, "n": 1}]))
    assert not [obj for obj in reachable(op.store) if isinstance(obj, WindowOperator)]
    op.close()


def test_the_stores_are_single_inheritance_and_pair_a_bucketing_with_a_storage() -> None:
    for module in (
        by_start,
        columnar_windows,
        run_windows,
        sliced_windows,
        sliced_runs,
        columnar_sessions,
        keyed,
        bucketing,
    ):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                bases = [b for b in cls.__bases__ if b.__module__.startswith("cutline.")]
                assert len(bases) <= 1, f"{cls.__name__} inherits from {bases}"
    pairs = {
        (Storage.COLUMNS, Tumbling): ("ColumnarWindows", "OneSlice", "Columns"),
        (Storage.COLUMNS, Sliding): ("SlicedWindows", "SharedSlices", "Columns"),
        (Storage.RUNS, Tumbling): ("RunWindows", "OneSlice", "Runs"),
        (Storage.RUNS, Sliding): ("SlicedRuns", "SharedSlices", "Runs"),
    }
    for (storage, kind), (store, bucket, kept) in pairs.items():
        assigner = kind(10) if kind is Tumbling else kind(20, 10)
        logic = WindowLogic(assigner, Aggregation("count"), "user", TimeColumn("ts", 0))
        backend = "memory" if storage is Storage.COLUMNS else "disk"
        assert logic.storage(backend) is storage
        ctx = OperatorContext("w", 0, 1, 128, 1, state=StateConfig(backend=backend))
        op = logic.open(ctx, None)
        found = op.store
        assert isinstance(found, by_start.WindowsByStart)
        names = (type(found).__name__, type(found.bucketing).__name__)
        assert (*names, type(found.storage).__name__) == (store, bucket, kept)
        op.close()
