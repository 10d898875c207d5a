"""The example programs run as their documentation says (``python -m cutline.examples...``),
on the tests' local Spark session, and print what they found and whether it is right."""

from __future__ import annotations

import runpy
import sys
from collections import Counter

import pytest

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
