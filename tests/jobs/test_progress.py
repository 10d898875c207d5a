"""Live progress: the figures per operator (``runtime/metrics.py``), their display
(``api/progress.py``), and ``JobResult.metrics`` after a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from cutline import StreamEnvironment, testing
from cutline.api.progress import render, wanted
from cutline.runtime.checkpoint.stats import CheckpointStats, RestartInfo
from cutline.runtime.driver.metrics import JobMetrics, MetricsCollector, OperatorMetrics
from cutline.runtime.task.local import ThreadLauncher


def to_key(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 7, "value": 1}


def keep_even(record: dict[str, int]) -> bool:
    return record["key"] % 2 == 0


def job(tmp_path: Path, records: int = 20_000) -> StreamEnvironment:
    env = StreamEnvironment(
        2, checkpoint_interval="0.2s", checkpoint_dir=str(tmp_path / "ck"), batch_size=1000
    )
    (
        env.from_sequence(0, records)
        .map(to_key, name="to_key")
        .filter(keep_even, name="even")
        .key_by("key")
        .sum("value", name="sum")
        .collect()
    )
    return env


def test_the_figures_after_a_run_count_every_record_exactly(tmp_path: Path) -> None:
    result = testing.execute(job(tmp_path), launcher=ThreadLauncher(), progress=False)
    metrics = result.metrics
    assert metrics is not None
    even = sum(1 for v in range(20_000) if (v % 7) % 2 == 0)
    assert metrics.operator("sequence").records_out == 20_000
    assert metrics.operator("to_key").records_in == 20_000
    assert metrics.operator("to_key").records_out == 20_000
    assert metrics.operator("even").records_in == 20_000
    assert metrics.operator("even").records_out == even
    assert metrics.operator("sum").records_in == even
    assert metrics.operator("sum").records_out == even
    assert metrics.operator("collect(collect)").records_in == even
    assert metrics.operators[0].name == "sequence"
    assert metrics.checkpoints and metrics.checkpoints[-1].final
    assert metrics.generation == 1
    assert all(0.0 <= o.backpressured <= 1.0 for o in metrics.operators)
    with pytest.raises(KeyError, match="no operator 'nope'"):
        metrics.operator("nope")


def test_progress_true_draws_the_operators_on_standard_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    testing.execute(job(tmp_path, 5_000), launcher=ThreadLauncher(), progress=True)
    err = capsys.readouterr().err
    for text in ("records in", "records out", "sequence", "to_key", "even", "sum", "checkpoint"):
        assert text in err


def test_no_progress_when_standard_error_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not wanted(None)  # the test's standard error is captured: not a terminal
    assert wanted(True) and not wanted(False)
    assert wanted(None, Console(force_terminal=True))
    testing.execute(job(tmp_path, 5_000), launcher=ThreadLauncher())
    assert "records in" not in capsys.readouterr().err


def test_rates_and_backpressure_come_from_the_heartbeats() -> None:
    env = StreamEnvironment(2)
    env.from_sequence(0, 10).map(to_key, name="to_key").key_by("key").sum("value").collect()
    plan = env.plan()
    collector = MetricsCollector(plan)
    collector.new_generation(1)
    source = plan.chains[0].uid
    downstream = plan.chains[1].uid

    def beat(t: float, out: int, blocked: float) -> None:
        figures = {}
        for i in range(2):
            figures[f"{source}-{i}"] = {
                "ops": {source: [0, out], "to_key": [out, out]},
                "backpressured": blocked,
            }
            figures[f"{downstream}-{i}"] = {"ops": {"sum": [out, out]}, "backpressured": 0.0}
        collector.heartbeat(figures, t)

    beat(10.0, 1000, 0.0)
    beat(11.0, 2000, 0.9)  # each source subtask was blocked 0.9 s of the second
    metrics = collector.snapshot(11.0)
    assert metrics.operator("sequence").records_out == 4000
    assert metrics.operator("sequence").rate_out == pytest.approx(2000.0)
    assert metrics.operator("to_key").backpressured == pytest.approx(0.9)
    assert metrics.operator("to_key").backpressure == "high"
    assert metrics.operator("sum(value)").backpressure == "ok"
    assert metrics.backpressured == ["sequence", "to_key"]  # its name=
    beat(13.0, 3000, 1.1)  # 1.1 s of the 3 s window: low
    assert collector.snapshot(13.0).operator("to_key").backpressured == pytest.approx(1.1 / 3)
    assert collector.snapshot(13.0).operator("to_key").backpressure == "low"
    beat(17.0, 4000, 1.1)  # not blocked since: the older samples leave the window
    assert collector.snapshot(17.0).operator("to_key").backpressure == "ok"
    collector.new_generation(2)  # a restart: figures start again
    assert collector.snapshot(13.0).operator("sequence").records_out == 0


def test_the_display_shows_operators_checkpoints_and_restarts() -> None:
    metrics = JobMetrics(
        elapsed=12.5,
        generation=2,
        operators=[
            OperatorMetrics("src", "source", 0, 5_000_000, 0.0, 250_000.0, 0.8),
            OperatorMetrics("sum", "sum(value)", 5_000_000, 5_000_000, 250_000.0, 250_000.0, 0.0),
        ],
        checkpoints=[
            CheckpointStats(7, 2, 0.25, size=2048, alignment=0.1),
            CheckpointStats(8, 2, 1.5, status="aborted", reason="expired"),
        ],
        restarts=[RestartInfo(1, "sum (subtask sum-0): ValueError: boom\n  trace", 3, 4.0)],
    )
    console = Console(record=True, width=140)
    console.print(render(metrics))
    text = console.export_text()
    assert "running 12.5 s · generation 2 · backpressured: source" in text
    assert "5.00M" in text and "250.00k" in text and "80% high" in text and "0% ok" in text
    assert "checkpoint 7: 0.25 s, 2.0 KiB, alignment 0.10 s" in text
    assert "checkpoint 8 aborted: expired" in text
    assert "restart after generation 1 (4.0 s): sum (subtask sum-0): ValueError: boom" in text
    assert "trace" not in text


def test_without_a_terminal_the_progress_is_a_line_per_event(tmp_path, capfd):
    env = StreamEnvironment(1, checkpoint_interval=None, checkpoint_dir=str(tmp_path / "ck"))
    env.from_sequence(0, 100).collect()
    testing.execute(
        env, launcher=ThreadLauncher()
    )  # progress=None, standard error captured: no terminal
    lines = capfd.readouterr().err.splitlines()
    assert any(line.startswith("cutline [") and " running generation 1: " in line for line in lines)
    [final] = [line for line in lines if " checkpoint " in line]
    assert final.endswith(" (final)") and "complete in" in final
    testing.execute(env, launcher=ThreadLauncher(), progress=False, fresh=True)
    assert capfd.readouterr().err == ""


def test_a_result_prints_as_a_short_summary(tmp_path):
    env = StreamEnvironment(2, checkpoint_interval=None, checkpoint_dir=str(tmp_path / "ck"))
    env.from_sequence(0, 50_000).collect("numbers")
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    text = repr(result)
    assert len(text) < 300, text
    assert text.startswith("JobResult(") and "1 generation(s)" in text
    assert "collected 'numbers': 50,000 records" in text
    assert f"the last {result.checkpoints[-1].checkpoint_id}" in text


def test_the_display_shows_each_restarts_delay_and_the_records_skipped() -> None:
    metrics = JobMetrics(
        elapsed=30.0,
        generation=3,
        operators=[OperatorMetrics("src", "clicks", 0, 10, 0.0, 1.0, 0.0)],
        restarts=[
            RestartInfo(1, "pg: cannot connect", 1, 4.0, delay=1.0),
            RestartInfo(2, "pg: cannot connect", 1, 6.5, delay=1.5),
        ],
        skipped={"clicks": 98},
    )
    console = Console(record=True, width=140)
    console.print(render(metrics))
    text = console.export_text()
    assert "generation 3 · skipped: clicks 98" in text
    assert "restart after generation 1 (4.0 s, waited 1.0 s): pg: cannot connect" in text
    assert "restart after generation 2 (6.5 s, waited 1.5 s): pg: cannot connect" in text
