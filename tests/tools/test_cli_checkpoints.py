"""``cutline checkpoints list | show | diff | verify`` and ``cutline report`` on real checkpoint
directories written by real jobs (thread launcher), through click's CliRunner.

Exit status: 0 when all is well, 1 when a checkpoint fails verification, 2 on bad input (a
missing or foreign directory, an unknown checkpoint).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from cutline import Checkpoints, FixedDelay, SourceHold, StreamEnvironment, testing
from cutline.cli import main
from cutline.cli_render import print_indented
from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.checkpoint.stats import CheckpointStats, RestartInfo
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.task.local import ThreadLauncher

KEYS = 50
RECORDS = 60_000


class FailOnce:
    """Key each record by ``value % KEYS``; raise once, at record ``at``, if ``marker`` does
    not exist yet (so the job restarts once)."""

    __name__ = "to_key"

    def __init__(self, marker: Path, at: int) -> None:
        self.marker, self.at = marker, at

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record["value"] == self.at and not self.marker.exists():
            self.marker.write_text("failed once")
            raise ValueError(f"injected failure at record {self.at}")
        return {"key": record["value"] % KEYS, "value": 1}


def run_job(directory: Path, *, retained: int = 100, fail: bool = True) -> Any:
    """The job; its sources hold half-way in the first attempt until a checkpoint completed,
    so that it has two complete checkpoints at least (with ``fail``, the failure comes
    before the hold, at a quarter of the input)."""
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(interval="0.1s", dir=str(directory / "ck"), retained=retained),
        batch_size=500,
        buffer_capacity=2,
        restart_strategy=FixedDelay(delay=0.1),
    )
    function = FailOnce(directory / "marker", RECORDS // 2 if fail else -1)
    (
        env.from_sequence(0, RECORDS, name="sequence")
        .map(function, name="to_key")
        .key_by("key")
        .sum("value", name="sum")
        .collect()
    )
    return testing.execute(
        env,
        launcher=ThreadLauncher(),
        progress=False,
        hold_sources=SourceHold(records=RECORDS // 4),
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("cli-job")
    result = run_job(directory)
    assert len(result.restarts) == 1
    return directory / "ck", result


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_list_names_every_checkpoint_and_the_restart(job: tuple[Path, Any]) -> None:
    ck, result = job
    out = cli("checkpoints", "list", ck)
    assert out.exit_code == 0, out.output
    data = json.loads(cli("checkpoints", "list", ck, "--json").output)
    completed = [c["checkpoint_id"] for c in data["checkpoints"] if c["status"] == "completed"]
    assert completed == [c.checkpoint_id for c in result.checkpoints]
    on_disk = {c["checkpoint_id"] for c in data["checkpoints"] if c["on_disk"]}
    assert on_disk == set(CheckpointStorage(str(ck)).completed_ids())
    assert [r["generation"] for r in data["restarts"]] == [1]
    assert "injected failure" in data["restarts"][0]["cause"]
    assert data["runs"][0]["outcome"] == "finished"
    for checkpoint_id in completed:
        assert f"│ {checkpoint_id:>2} │" in out.output or f"│ {checkpoint_id} │" in out.output
    assert "restart: generation 1" in out.output and "injected failure" in out.output
    assert f"restore_from='latest' resumes checkpoint {completed[-1]}" in out.output


def test_show_gives_subtasks_critical_path_operators_and_channels(job: tuple[Path, Any]) -> None:
    ck, result = job
    latest = result.checkpoints[-1].checkpoint_id
    out = cli("checkpoints", "show", ck, "latest")
    assert out.exit_code == 0, out.output
    assert f"checkpoint {latest}: completed" in out.output
    for subtask in ("sequence-0", "sequence-1", "sum-0", "sum-1"):
        assert subtask in out.output
    # the path runs back from the subtask acknowledged last (a sum, or a source when a source's
    # acknowledgement happened to come last) to a source
    assert "critical path: " in out.output
    hops = out.output.split("critical path: ", 1)[1].split("operators with state")[0]
    hops = hops.split("\n  <- ")
    assert hops[0].startswith(("sum-", "sequence-")), hops
    assert hops[-1].startswith("sequence-"), hops
    assert "operators with state" in out.output
    assert "keyed" in out.output and "source" in out.output and "sink" in out.output


def test_show_of_a_discarded_checkpoint_gives_its_statistics_only(tmp_path: Path) -> None:
    result = run_job(tmp_path, retained=1, fail=False)
    ck = tmp_path / "ck"
    first = result.checkpoints[0].checkpoint_id
    assert not (ck / f"chk-{first}").exists()
    out = cli("checkpoints", "show", ck, first)
    assert out.exit_code == 0, out.output
    assert f"checkpoint {first}: completed" in out.output
    assert "not on disk any more" in out.output
    out = cli("checkpoints", "diff", ck, first, "latest")
    assert out.exit_code == 2 and "is not on disk any more" in out.output


def test_diff_gives_exactly_the_keys_whose_counts_changed(job: tuple[Path, Any]) -> None:
    ck, _ = job
    completed = CheckpointStorage(str(ck)).completed_ids()
    a, b = completed[0], completed[-1]
    before = {e.key: e.value for e in open_checkpoint(str(ck), a).keyed_entries("sum")}
    out = cli("checkpoints", "diff", ck, a, b, "--json")
    assert out.exit_code == 0, out.output
    changes = [json.loads(line) for line in out.output.splitlines()]
    final = RECORDS // KEYS  # every key ends at its count: the last checkpoint is the final one
    expected_changed = {k for k, v in before.items() if v != final}
    expected_added = set(range(KEYS)) - set(before)
    assert {int(c["key"]) for c in changes if c["change"] == "changed"} == expected_changed
    assert {int(c["key"]) for c in changes if c["change"] == "added"} == expected_added
    assert not [c for c in changes if c["change"] == "removed"]
    assert all(c["b"] == repr(final) for c in changes)
    assert all(c["a"] == repr(before[int(c["key"])]) for c in changes if c["change"] == "changed")
    text = cli("checkpoints", "diff", ck, a, b, "--limit", "3")
    assert f"checkpoint {a} → {b}: {len(expected_changed)} changed" in text.output
    if len(changes) > 3:
        assert f"... and {len(changes) - 3} more" in text.output


def test_diff_of_a_checkpoint_with_itself_finds_nothing(job: tuple[Path, Any]) -> None:
    ck, _ = job
    out = cli("checkpoints", "diff", ck, "latest", "latest", "--operator", "sum")
    assert out.exit_code == 0, out.output
    assert "0 changed, 0 added, 0 removed" in out.output
    out = cli("checkpoints", "diff", ck, "latest", "latest", "--operator", "nope")
    assert out.exit_code == 2 and "no keyed state of operator 'nope'" in out.output


def test_verify_passes_on_every_checkpoint_and_on_one_folder(job: tuple[Path, Any]) -> None:
    ck, _ = job
    out = cli("checkpoints", "verify", ck)
    assert out.exit_code == 0, out.output
    completed = CheckpointStorage(str(ck)).completed_ids()
    assert out.output.count(": OK — ") == len(completed)
    assert "a consistent cut on all 4 channels" in out.output
    single = cli("checkpoints", "verify", ck / f"chk-{completed[0]}")
    assert single.exit_code == 0 and ": OK — " in single.output


def test_verify_fails_on_a_tampered_count_and_names_the_channel(tmp_path: Path) -> None:
    run_job(tmp_path, fail=False)
    ck = tmp_path / "ck"
    n = CheckpointStorage(str(ck)).completed_ids()[-2]
    metadata_path = ck / f"chk-{n}" / "_metadata"
    metadata = json.loads(metadata_path.read_text())
    handle = metadata["handles"]["sum-0"]
    channel = sorted(handle["channels"]["received"])[0]
    handle["channels"]["received"][channel] -= 1
    metadata_path.write_text(json.dumps(metadata))
    out = cli("checkpoints", "verify", ck)
    assert out.exit_code == 1
    assert f"checkpoint {n}: FAILED" in out.output
    assert f"channel {channel}:" in out.output and "(1 lost)" in out.output
    assert "1 of " in out.output


def test_errors_on_a_missing_a_foreign_or_a_wrong_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a checkpoint")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for command in (["list"], ["show", "1"], ["diff", "1", "2"], ["verify"]):
        out = cli("checkpoints", command[0], missing, *command[1:])
        assert out.exit_code == 2 and f"{missing} does not exist" in out.output, out.output
        out = cli("checkpoints", command[0], foreign, *command[1:])
        assert out.exit_code == 2, out.output
        assert f"{foreign} is not a cutline checkpoint directory" in out.output
    out = cli("checkpoints", "list", a_file)
    assert out.exit_code == 2 and "is not a directory" in out.output
    out = cli("report", missing, "-o", tmp_path / "r.html")
    assert out.exit_code == 2 and "does not exist" in out.output


def test_errors_on_a_bad_or_unknown_checkpoint_id(job: tuple[Path, Any]) -> None:
    ck, _ = job
    out = cli("checkpoints", "show", ck, "abc")
    assert out.exit_code == 2 and "'abc' is not a checkpoint id" in out.output
    out = cli("checkpoints", "show", ck, "9999")
    assert out.exit_code == 2 and "has no checkpoint 9999" in out.output
    out = cli("checkpoints", "list", ck / "chk-1")
    if (ck / "chk-1" / "_metadata").exists():
        assert out.exit_code == 2 and "is one checkpoint or savepoint folder" in out.output


def test_the_collect_sink_agrees_with_the_final_state(job: tuple[Path, Any]) -> None:
    """The last checkpoint's keyed state is the last running sum the sink got for each key."""
    ck, result = job
    last: Counter[int] = Counter()
    for record in result.output:
        last[record["key"]] = max(last[record["key"]], record["value"])
    state = {e.key: e.value for e in open_checkpoint(str(ck)).keyed_entries("sum")}
    assert state == dict(last)


# --------------------------------------------------- a completed checkpoint without metadata


def test_a_completed_checkpoint_whose_metadata_was_deleted_is_named_and_fails_verify(
    job: tuple[Path, Any], tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(job[0], ck)
    storage = CheckpointStorage(str(ck))
    completed = storage.completed_ids()
    n = completed[-1]
    missing = ck / f"chk-{n}" / "_metadata"
    missing.unlink()
    reason = (
        f"checkpoint {n} is incomplete: its _metadata is missing, though its statistics say "
        f"it completed ({missing} does not exist)"
    )

    out = cli("checkpoints", "list", ck)
    assert out.exit_code == 0, out.output
    (row,) = [line for line in out.output.splitlines() if re.match(rf"│ *{n} │", line)]
    assert "incomplete (_metadata missing)" in row and "no _metadata" in row
    assert f"incomplete: {reason}; it is never restored from" in out.output
    data = json.loads(cli("checkpoints", "list", ck, "--json").output)
    assert data["metadata_missing"] == [n]
    (entry,) = [c for c in data["checkpoints"] if c["checkpoint_id"] == n]
    assert entry["metadata_missing"] and not entry["on_disk"]

    every = cli("checkpoints", "verify", ck)
    assert every.exit_code == 1
    assert f"checkpoint {n}: FAILED — 1 problem(s); the first: {reason}" in every.output
    assert every.output.count(": OK — ") == len(completed) - 1
    assert f"1 of {len(completed)} checkpoints failed verification" in every.output
    one = cli("checkpoints", "verify", ck, n)
    assert one.exit_code == 1 and f"checkpoint {n}: FAILED" in one.output and reason in one.output

    show = cli("checkpoints", "show", ck, n)
    assert show.exit_code == 0 and f"its state cannot be read: {reason}" in show.output
    diff = cli("checkpoints", "diff", ck, completed[0], n)
    assert diff.exit_code == 2 and reason in diff.output
    if len(completed) > 1:
        latest = cli("checkpoints", "show", ck, "latest")  # the newest one with metadata
        assert f"checkpoint {completed[-2]}: completed" in latest.output

    _, skipped = storage.latest()
    assert [(s.checkpoint_id, s.reason) for s in skipped] == [(n, reason)]


def test_a_folder_without_metadata_or_statistics_is_still_in_progress(
    job: tuple[Path, Any], tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(job[0], ck)
    (ck / "chk-9999").mkdir()
    (ck / "chk-9999" / "g1-sum-0.state").write_bytes(b"partial")
    out = cli("checkpoints", "verify", ck, "9999")
    assert out.exit_code == 2 and "checkpoint 9999 is incomplete (no _metadata)" in out.output
    every = cli("checkpoints", "verify", ck)
    assert every.exit_code == 0, every.output
    listed = cli("checkpoints", "list", ck)
    assert "9999" not in listed.output and "_metadata missing" not in listed.output


# ------------------------------------------------------------------ restart causes whole


def test_list_shows_a_restart_cause_whole(job: tuple[Path, Any]) -> None:
    ck, result = job
    out = cli("checkpoints", "list", ck)
    cause = result.restarts[0].cause
    assert len(cause.splitlines()) > 1  # the operator's line, the record, the traceback
    assert cause.splitlines()[0] in out.output
    words = out.output.split()
    for word in cause.split():
        assert word in words, f"{word!r} of the cause is missing or cut"
    # the restart's cause is whole (an aborted checkpoint's reason in the table is cut to its
    # first 60 characters, and whether a checkpoint was in flight at the failure is timing)
    restart = out.output[out.output.index("restart: generation") :]
    assert "…" not in restart


def test_a_long_restart_cause_is_wrapped_at_words_not_cut(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "ck"))
    first = "map(parse) (subtask 1) failed on record {'line': 7}: " + " ".join(
        f"word{i}" for i in range(80)
    )
    cause = f"{first}\n  record: [/not markup]\nValueError: the end [bold]"
    storage.write_stats(RestartInfo(1, cause, None, 0.5, run="0a1b", time=1.7e9))
    out = cli("checkpoints", "list", tmp_path / "ck")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("restart: generation 1"))
    shown = lines[start + 1 :]
    assert all(line.startswith("    ") and len(line) <= 160 for line in shown)
    assert " ".join(shown).split() == cause.split()
    assert "    ValueError: the end [bold]" in shown and "      record: [/not markup]" in shown


def test_a_cause_is_wrapped_to_the_width_keeping_the_indent() -> None:
    console = Console(file=io.StringIO(), width=40, highlight=False)
    text = "first line " + "long " * 20 + "\n  indented line " + "more " * 12 + "\n"
    print_indented(console, text)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= 40 for line in lines)
    assert lines[0].startswith("    first line ")
    second = next(i for i, line in enumerate(lines) if "indented" in line)
    assert lines[second].startswith("      indented")
    assert all(line.startswith("      more") for line in lines[second + 1 :])
    assert " ".join(lines).split() == text.split()


# ------------------------------------------------- a disk full while writing statistics


def test_a_statistics_write_that_fails_midway_leaves_nothing_unreadable_for_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage(str(tmp_path / "ck"))
    storage.write_stats(CheckpointStats(checkpoint_id=1, generation=1, duration=0.1))
    real_open = storage.fs.open

    class Full:
        """Takes a few bytes of a write, then the disk is full."""

        def __init__(self, file: Any) -> None:
            self.file = file

        def write(self, data: bytes) -> int:
            self.file.write(data[:5])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.file, name)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

    def open_(path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        file = real_open(path, mode, *args, **kwargs)
        return Full(file) if "w" in mode else file

    monkeypatch.setattr(storage.fs, "open", open_)
    for n in (1, 2):  # one written again, one new
        with pytest.raises(StorageError, match="No space left on device"):
            storage.write_stats(CheckpointStats(checkpoint_id=n, generation=2, duration=0.2))
    monkeypatch.undo()

    assert sorted(p.name for p in (tmp_path / "ck" / "_stats").iterdir()) == ["checkpoint-1.json"]
    out = cli("checkpoints", "list", tmp_path / "ck")
    assert out.exit_code == 0, out.output
    assert "unreadable" not in out.output
    data = json.loads(cli("checkpoints", "list", tmp_path / "ck", "--json").output)
    assert data["unreadable"] == []
    assert [(c["checkpoint_id"], c["generation"]) for c in data["checkpoints"]] == [(1, 1)]
