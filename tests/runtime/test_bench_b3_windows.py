"""The window-state benchmark (bench/b3_windows.py, B3w) at a tiny size: it runs, restores every
checkpoint of both backends and verifies what fires; and its check refuses wrong output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import cutline

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_window_state_benchmark_verifies_every_backend_at_a_tiny_size(tmp_path: Path):
    src = str(Path(cutline.__file__).resolve().parents[1])  # (the cutline these tests import)
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    out = tmp_path / "b3w.json"
    command = [sys.executable, str(BENCH / "b3_windows.py"), "--sizes", "1000", "--repeats", "2"]
    done = subprocess.run(
        [*command, "--out", str(out), "--tmp-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    found = {m["parameters"]["backend"]: m for m in document["measurements"]}
    assert set(found) == {"memory", "disk", "disk-4MiB"}
    assert found["memory"]["parameters"]["operator"] == "WindowOperator(ColumnarWindows)"
    assert found["disk"]["parameters"]["operator"] == "WindowOperator(RunWindows)"
    assert found["disk-4MiB"]["parameters"]["incremental_operator"]["memory"] == 4 << 20
    for measurement in found.values():
        assert measurement["verified"] is True, measurement["verification"]
        assert measurement["parameters"]["records"] == [1000, 10, 10]
        assert len(measurement["runs"]) == 2
        figures = measurement["figures"]
        assert figures["size_bytes_full"]["median"] > 0
        assert figures["full_over_incremental"]["median"] > 0
        for operator in ("incremental_operator", "non_incremental_operator"):
            assert set(figures[operator]["restore_s"]) == {"c1", "c2", "c3"}
    # the runs' incremental checkpoint is the changed keys, not all of them
    assert found["disk"]["figures"]["full_over_incremental"]["median"] > 5


def test_the_benchmarks_check_refuses_what_did_not_fire_exactly(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import b3_windows as b3w

    expected = np.array([5, -3, 0, 7], dtype=np.int64)

    def fired(keys: list[int], sums: list[int], start: int = b3w.WINDOW_START) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "key": pa.array(keys, pa.int64()),
                "window_start": pa.array([start] * len(keys), pa.int64()),
                "window_end": pa.array([b3w.WINDOW_START + b3w.HOUR] * len(keys), pa.int64()),
                "v": pa.array(sums, pa.int64()),
            }
        )

    assert b3w.check_fired(fired([2, 0, 3, 1], [0, 5, 7, -3]), expected) == []
    assert b3w.check_fired(None, expected)
    assert b3w.check_fired(fired([0, 1, 2, 3], [5, -3, 1, 7]), expected)  # a sum off by one
    assert b3w.check_fired(fired([0, 1, 3], [5, -3, 7]), expected)  # a key missing
    assert b3w.check_fired(fired([0, 1, 2, 3, 3], [5, -3, 0, 7, 7]), expected)  # twice
    assert b3w.check_fired(fired([0, 1, 2, 3], [5, -3, 0, 7], start=0), expected)
