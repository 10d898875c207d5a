"""The example programs run as their documentation says (``python -m cutline.examples...``),
on the tests' local Spark session, and print what they found and whether it is right."""

from __future__ import annotations

import datetime as dt
import runpy
import sys
from collections import Counter
from pathlib import Path

import pytest

from cutline.examples.ad_attribution import RARE, TOLERANCE, expected, make_input, published
from cutline.examples.connected_components import (
    GROUPS,
    edge,
    expected_labels,
    final_labels,
    random_edge,
)


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
def test_connected_components_runs_as_a_program_and_prints_a_right_result(
    spark, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``python -m``: the job's functions are those of ``__main__`` (sent by value)."""
    argv = ["connected_components", "--edges", "600", "--vertices", "500"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(
            "cutline.examples.connected_components", run_name="__main__", alter_sys=True
        )
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    sizes = Counter(expected_labels(600, 500, random_edge).values())
    assert (
        f"600 edges over {sum(sizes.values())} vertices: {len(sizes)} connected components" in out
    )
    largest, size = max(sizes.items(), key=lambda item: (item[1], -item[0]))
    assert f"  the component of vertex {largest}: {size} vertices" in out
    assert "each (vertex, label) once: True" in out
    assert (
        "the smallest vertex of its component (as a union-find over the same edges says): True"
        in out
    )


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
def test_ad_attribution_runs_as_a_program_and_attributes_every_click_as_plain_python_does(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``python -m cutline.examples.ad_attribution WORKDIR``: every click published once,
    with the last view of its ad at most ten minutes before it, the edges of the rule
    included (a view at the click's millisecond, exactly ten minutes before, one millisecond
    more); nothing late."""
    workdir = tmp_path / "work"
    monkeypatch.setattr(sys, "argv", ["ad_attribution", str(workdir)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("cutline.examples.ad_attribution", run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out

    views, clicks = make_input()
    rows = published(workdir / "attributed")
    assert sorted(r["click"] for r in rows) == sorted(c["click"] for f in clicks for c in f)
    assert {r["click"]: r["view"] for r in rows} == expected(views, clicks)
    assert list(rows[0]) == ["ad", "ts", "click", "ts_view", "view"]
    for r in rows:
        assert r["view"] is None or dt.timedelta(0) <= r["ts"] - r["ts_view"] <= TOLERANCE
    ages = {
        r["click"]: None if r["view"] is None else (r["ts"] - r["ts_view"]).total_seconds()
        for r in rows
        if r["ad"] == RARE
    }
    assert [ages[c] for c in ("c0007", "c0033", "c0034")] == [0.0, 600.0, None]  # the edges
    assert not published(workdir / "late-clicks") and not published(workdir / "late-views")
    assert "1200 views in 3 files and 303 clicks in 2 files of 5 ads" in out
    assert "belts      32         24    8" in out
    assert "  c0034  belts  12:12:29.751  not attributed (no view in the 10 min before)" in out
    assert "303 clicks published, 295 attributed; 0 late records (0 counted by the join)" in out
    assert "each click published once: True" in out
    assert "every attribution equal to the plain-Python rule: True" in out


def test_the_example_graph_has_components_of_more_than_two_vertices() -> None:
    """``random_edge`` makes the loop work (labels travel several hops); the tests' ``edge``
    pairs vertices only, and both keep every edge within its group."""
    sizes = Counter(expected_labels(1_500, 1_000, random_edge).values())
    assert len(sizes) >= GROUPS and max(sizes.values()) > 100
    assert set(Counter(expected_labels(1_500, 1_000).values()).values()) == {2}
    for generate in (edge, random_edge):
        assert all(u % GROUPS == v % GROUPS for u, v in (generate(i, 1_000) for i in range(500)))


def test_final_labels_keep_the_smallest_label_of_each_vertex() -> None:
    drops = [
        {"vertex": 7, "label": 7},
        {"vertex": 7, "label": 3},
        {"vertex": 3, "label": 3},
        {"vertex": 7, "label": 5},
    ]
    assert final_labels(drops) == {7: 3, 3: 3}


@pytest.mark.connectors
def test_kafka_to_postgres_starts_its_servers_kills_a_worker_and_finds_the_tables_exact(
    spark, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cutline.examples import kafka_to_postgres

    code = kafka_to_postgres.main([str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "a worker was killed mid-job: True" in out
    assert "every running sum in table sums once (6000 rows): True" in out
    assert "every user's total in table totals: True" in out
    assert "no prepared transaction left: True" in out
