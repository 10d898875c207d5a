"""A connector of the public API (``tests/ledger.py``, written against ``cutline.connectors``
only) in real jobs (slots as threads): read exactly once through a failure at a random entry,
through a stop with a savepoint and a restore at another parallelism, its accounts dealt by
number or by hash; and a connector that breaks the contract is named with what it did.

Every result is known in plain Python: each account is one split, read in order by one
subtask, so its running balance at every entry is fixed; and its entries are at most
``DISORDER`` ms out of order (the job's bound), so no record is late and every window's count
is fixed.
"""

from __future__ import annotations

import json
import random
import sys
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from test_savepoints import SavepointOnHold, endpoints_of

from cutline import (
    EventTime,
    FixedDelay,
    JobClient,
    JobFailedError,
    SourceHold,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.runtime.task.local import ThreadLauncher

from docs_examples import docs_example
from ledger import (
    DISORDER,
    Broken,
    Closing,
    Journal,
    Ledger,
    Ledgerbook,
    entries,
    first_time,
    journal,
)

Row = dict[str, Any]


@dataclass(frozen=True)
class FailAt:
    """Raises once (a flag file remembers it), on entry ``entry`` of account ``account``."""

    account: str
    entry: int
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_at"

    def __call__(self, record: Row) -> Row:
        hit = record["account"] == self.account and record["entry"] == self.entry
        if hit and first_time(self.flag):
            raise RuntimeError(f"injected failure at {self.account}#{self.entry}")
        return record


def ledger_job(
    tmp_path: Path,
    parallelism: int,
    ledger: Ledger,
    out: Path,
    *,
    checkpoints: str = "ck",
    fail: FailAt | None = None,
    **options: Any,
) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / checkpoints,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 40,
    }
    settings.update(options)
    env = StreamEnvironment(parallelism, **settings)
    stream = env.from_source(
        ledger, name="ledger", event_time=EventTime("ts", max_out_of_orderness=f"{DISORDER}ms")
    )
    if fail is not None:
        stream = stream.map(fail, name="fail")
    keyed = stream.key_by("account")
    keyed.sum("amount", name="balance").write_parquet(out / "balances", name="balances")
    keyed.window(Tumbling("1s")).count(name="per_second").write_parquet(
        out / "counts", name="counts"
    )
    return env


def published(*folders: Path) -> list[Row]:
    rows: list[Row] = []
    for folder in folders:
        if folder.exists():
            rows += ds.dataset(str(folder), format="parquet").to_table().to_pylist()
    return rows


def assert_exact(
    ledger: Ledger, balances: list[Row], counts: list[Row], *, with_windows: bool = True
) -> None:
    """Every entry once with its account's balance after it; every window once, counted."""
    wanted: dict[tuple[str, int], int] = {}
    running: Counter[str] = Counter()
    windows: Counter[tuple[str, int]] = Counter()
    for e in entries(ledger.accounts, ledger.per_account):
        running[e["account"]] += e["amount"]
        wanted[(e["account"], e["entry"])] = running[e["account"]]
        windows[(e["account"], e["ts"] - e["ts"] % 1000)] += 1
    got = Counter((r["account"], r["entry"]) for r in balances)
    assert max(got.values()) == 1, "an entry published twice"
    assert {(r["account"], r["entry"]): r["amount"] for r in balances} == wanted
    if not with_windows:
        return
    got_windows = Counter((r["account"], r["window_start"]) for r in counts)
    assert max(got_windows.values()) == 1, "a window published twice"
    assert {(r["account"], r["window_start"]): r["count"] for r in counts} == dict(windows)


@pytest.mark.parametrize(("numbered", "parallelism", "seed"), [(True, 2, 1), (False, 3, 2)])
def test_a_connector_is_read_exactly_once_through_a_failure_at_a_random_entry(
    tmp_path: Path, numbered: bool, parallelism: int, seed: int
) -> None:
    rng = random.Random(seed)
    ledger = Ledger(accounts=7, per_account=300, numbered=numbered)
    fail = FailAt(f"acct-{rng.randrange(7):02d}", rng.randrange(100, 300), str(tmp_path / "failed"))
    env = ledger_job(tmp_path, parallelism, ledger, tmp_path / "out", fail=fail)
    # held part-way until two checkpoints completed: the failure comes after one, whatever
    # the speed (each subtask reads at least 100 entries of every account it has before)
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1 and "injected failure" in result.restarts[0].cause
    out = tmp_path / "out"
    assert_exact(ledger, published(out / "balances"), published(out / "counts"))


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_a_connector_stopped_with_a_savepoint_resumes_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: int, after: int
) -> None:
    ledger = Ledger(accounts=5, per_account=300, numbered=False)
    env = ledger_job(tmp_path, before, ledger, tmp_path / "out1")
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint(stop=True)
    )
    first = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=150, checkpoints=1000),  # until the job stops
    )
    path = asking.answer()
    assert isinstance(path, str) and first.savepoints == [path]
    env = ledger_job(tmp_path, after, ledger, tmp_path / "out2", checkpoints="ck2")
    second = testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    assert second.restored_from == path
    one, two = tmp_path / "out1", tmp_path / "out2"
    assert published(one / "balances") and published(two / "balances"), "stopped half-way"
    assert_exact(
        ledger,
        published(one / "balances", two / "balances"),
        published(one / "counts", two / "counts"),
    )


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raises", r"source broken failed to read: ConnectionError: the ledger's server went away"),
        ("wrong", r"source broken: its reader's read\(\) returned \[\{'x': 1\}\], not Records"),
        ("stranger", r"source broken: its reader returned records of split 'elsewhere'"),
        ("unpicklable", r"source broken: the position of split 'only' cannot be pickled"),
        ("nameless", r"source broken: its reader returned Records without a split"),
    ],
)
def test_a_connector_that_breaks_the_contract_is_named(
    tmp_path: Path, how: str, message: str
) -> None:
    env = StreamEnvironment(
        1,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(0, delay=0),
    )
    env.from_source(Broken(how), name="broken").collect()
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())


def test_from_source_takes_a_source(tmp_path: Path) -> None:
    env = StreamEnvironment(1)
    with pytest.raises(TypeError, match=r"from_source takes a cutline.connectors.Source, not list"):
        env.from_source([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no such column"):
        env.from_source(Ledger(), event_time="time")


def test_the_source_of_the_write_your_own_page_runs_as_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/connectors/writing.md's example, as it is written there."""
    code = docs_example("writing-source").code
    env = StreamEnvironment(2, checkpoint_interval=0.05, checkpoint_dir=tmp_path / "ck")
    page_module = types.ModuleType("countdown_page")  # (where its classes live)
    page_module.env = env  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "countdown_page", page_module)
    exec(
        compile(code, "docs/connectors/writing.md", "exec", dont_inherit=True), page_module.__dict__
    )
    assert len(code.splitlines()) < 80
    result = testing.execute(env, launcher=ThreadLauncher())
    last: dict[str, int] = {}
    for row in result.output:
        last[row["split"]] = max(last.get(row["split"], 0), row["n"])
    assert len(result.output) == 3 * 1000
    assert last == {s: sum(range(1, 1001)) for s in "abc"}


# --------------------------------------------------------------------------------- sinks


def balances_to(
    tmp_path: Path, parallelism: int, ledger: Ledger, sink: Any, *, fail: FailAt | None = None
) -> StreamEnvironment:
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
    )
    stream = env.from_source(ledger, name="ledger")
    if fail is not None:
        stream = stream.map(fail, name="fail")
    stream.key_by("account").sum("amount", name="balance").sink_to(sink, name="journal")
    return env


def test_a_two_phase_commit_sink_of_the_api_is_exact_through_a_failure(tmp_path: Path) -> None:
    ledger = Ledger(accounts=5, per_account=300)
    fail = FailAt("acct-03", 250, str(tmp_path / "failed"))
    env = balances_to(tmp_path, 2, ledger, Journal(str(tmp_path / "journal")), fail=fail)
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1
    rows = journal(tmp_path / "journal")
    assert_exact(ledger, rows, [], with_windows=False)


def test_a_sink_whose_commit_fails_is_committed_by_the_restored_job_once(
    tmp_path: Path,
) -> None:
    """The journal's first commit raises: the job fails over, and the restored writer commits
    what the restored checkpoint prepared; nothing lost, nothing twice."""
    ledger = Ledger(accounts=4, per_account=300)
    sink = Journal(str(tmp_path / "journal"), fail_commit=str(tmp_path / "failed"))
    result = testing.execute(
        balances_to(tmp_path, 2, ledger, sink),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert len(result.restarts) == 1
    assert "the journal's disk went away" in result.restarts[0].cause
    assert_exact(ledger, journal(tmp_path / "journal"), [], with_windows=False)


@pytest.mark.parametrize("where", ["a task", "the global commit"])
def test_a_sink_with_a_global_committer_commits_every_checkpoint_once(
    tmp_path: Path, where: str
) -> None:
    """One commit per checkpoint for every subtask, on the driver: through a failure of a
    task, and through a failure of the global commit itself (the restored job commits the
    restored checkpoint again: it was not)."""
    ledger = Ledger(accounts=4, per_account=300)
    flag = str(tmp_path / "failed")
    sink = Ledgerbook(str(tmp_path / "book"), fail_commit=flag if where != "a task" else None)
    fail = FailAt("acct-01", 250, flag) if where == "a task" else None
    result = testing.execute(
        balances_to(tmp_path, 2, ledger, sink, fail=fail),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert len(result.restarts) == 1
    if where != "a task":
        assert "sink journal: the global commit of checkpoint" in result.restarts[0].cause
        assert "the ledgerbook's table is locked" in result.restarts[0].cause
    assert_exact(ledger, journal(tmp_path / "book"), [], with_windows=False)
    committed = (tmp_path / "book" / "_committed").read_text().split()
    assert len(committed) == len(set(committed)), "a checkpoint committed twice"


def test_sink_to_a_function_is_at_least_once(tmp_path: Path) -> None:
    """Every record reaches the function, those after the restored checkpoint twice."""
    ledger = Ledger(accounts=4, per_account=200)
    fail = FailAt("acct-01", 150, str(tmp_path / "failed"))
    env = balances_to(tmp_path, 2, ledger, AppendTo(str(tmp_path / "seen.jsonl")), fail=fail)
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    counts = Counter((r["account"], r["entry"]) for r in seen)
    assert set(counts) == {(f"acct-{a:02d}", i) for a in range(4) for i in range(200)}
    assert sum(counts.values()) > len(counts), "some came twice: at least once, not exactly"


@dataclass(frozen=True)
class AppendTo:
    path: str

    @property
    def __name__(self) -> str:
        return "append_to"

    def __call__(self, batch: Any) -> None:
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else batch
        with open(self.path, "a") as out:
            out.write("".join(json.dumps(r) + "\n" for r in rows))


def test_the_sink_of_the_write_your_own_page_is_exact_through_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/connectors/writing.md's two-phase-commit sink, as it is written there."""
    code = docs_example("writing-sink").code
    assert len(code.splitlines()) < 80
    ledger = Ledger(accounts=4, per_account=250)
    fail = FailAt("acct-02", 200, str(tmp_path / "failed"))
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
    )
    stream = env.from_source(ledger, name="ledger").map(fail, name="fail")
    page_module = types.ModuleType("journal_page")
    page_module.stream = stream.key_by("account").sum("amount", name="balance")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "journal_page", page_module)
    monkeypatch.chdir(tmp_path)  # ("out/")
    exec(
        compile(code, "docs/connectors/writing.md", "exec", dont_inherit=True), page_module.__dict__
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1
    assert_exact(ledger, journal(tmp_path / "out"), [], with_windows=False)


def test_a_sink_of_the_api_counts_as_a_sink(tmp_path: Path) -> None:
    """No "no sink" warning for a job whose only sink is ``sink_to``; its operator is a sink
    in the checkpoints' statistics (``cutline checkpoints show``)."""
    import warnings

    env = StreamEnvironment(1, checkpoint_interval=None, checkpoint_dir=tmp_path / "ck")
    env.from_source(Ledger(accounts=1, per_account=10), name="ledger").sink_to(
        AppendTo(str(tmp_path / "seen.jsonl")), name="hook"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = testing.execute(env, launcher=ThreadLauncher())
    assert len((tmp_path / "seen.jsonl").read_text().splitlines()) == 10
    from cutline.runtime.checkpoint.reader import open_checkpoint

    extra = open_checkpoint(str(tmp_path / "ck")).metadata.extra
    names = {name: uid for uid, name in extra["operator_names"].items()}
    assert extra["operator_kinds"][names["hook"]] == "sink" and result.checkpoints[-1].final


def test_readers_are_told_of_completed_checkpoints_and_closed_when_their_subtask_ends(
    tmp_path: Path,
) -> None:
    """Through a failure: the failed attempt's readers are closed too."""
    ledger = Closing(accounts=4, per_account=200, folder=str(tmp_path))
    fail = FailAt("acct-01", 150, str(tmp_path / "failed"))
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
    )
    env.from_source(ledger, name="ledger").map(fail, name="fail").collect()
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1
    for subtask in range(2):
        notes = (tmp_path / f"reader-{subtask}").read_text().splitlines()
        assert notes.count("closed") == 2, notes  # once per attempt
        completed = [int(n.split()[1]) for n in notes if n.startswith("complete")]
        assert completed and completed == sorted(completed)
        assert result.checkpoints[-1].checkpoint_id in completed
