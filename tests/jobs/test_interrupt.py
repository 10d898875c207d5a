"""Ctrl-C: the job's attempt is cancelled, the program says where the job got to and how to
resume it, in one line and without a traceback, and exits with status 130; resumed with
``restore_from="latest"``, the job publishes everything exactly once. The interrupt lands while
the job runs by construction: after its first checkpoint, while its sources hold."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutline import StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

N = 20_000

JOB = f"""
import sys
from pathlib import Path
from cutline import SourceHold, StreamEnvironment
from cutline.runtime.task.local import ThreadLauncher

def build(work):
    env = StreamEnvironment(2, checkpoint_interval=0.05, checkpoint_dir=str(work / "ck"))
    (env.from_sequence(1, {N} + 1, name="numbers")
        .map(lambda r: {{"key": r["value"] % 5, "value": r["value"]}})
        .key_by("key")
        .sum("value", name="sums")
        .write_jsonl(work / "out", name="out"))
    return env

if __name__ == "__main__":
    work = Path(sys.argv[1])

    def listener(kind, message):
        if kind == "checkpoint":
            (work / "checkpointed").touch()

    launcher = ThreadLauncher() if sys.argv[2] == "threads" else None
    build(work).execute(
        launcher=launcher, listener=listener, hold_sources=SourceHold(records=2_000),
        progress=False,
    )
"""


def _interrupt(tmp_path: Path, launcher: str) -> subprocess.CompletedProcess[str]:
    """Run the job in a process of its own; SIGINT it once a checkpoint completed."""
    (tmp_path / "job.py").write_text(JOB)
    job = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py"), str(tmp_path), launcher],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not (tmp_path / "checkpointed").exists():
            if job.poll() is not None:
                pytest.fail(f"the job ended before its first checkpoint: {job.stderr.read()}")
            time.sleep(0.02)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def _sums(out: Path) -> list[dict]:
    return [
        json.loads(line)
        for part in out.glob("part-*.jsonl")
        for line in part.read_text().splitlines()
    ]


def _assert_exactly_once(records: list[dict]) -> None:
    """Every key's running sums of 1..N, each once: as many as its values, all different (the
    values are positive), the last one its total. (Two source subtasks interleave a key's
    values in no defined order, so the sums in between depend on the run.)"""
    assert len(records) == N
    by_key: dict[int, list[int]] = {}
    for record in records:
        by_key.setdefault(record["key"], []).append(record["value"])
    totals = {k: sum(v for v in range(1, N + 1) if v % 5 == k) for k in range(5)}
    assert {k: max(v) for k, v in by_key.items()} == totals
    assert {k: len(set(v)) for k, v in by_key.items()} == {k: N // 5 for k in range(5)}


@pytest.mark.parametrize("launcher", ["threads", pytest.param("spark", marks=pytest.mark.slow)])
def test_ctrl_c_says_where_the_job_got_to_and_exits_130_and_the_job_resumes_exactly(
    tmp_path, launcher
):
    ended = _interrupt(tmp_path, launcher)
    assert ended.returncode == 130
    lines = [line for line in ended.stderr.splitlines() if line.startswith("cutline:")]
    assert len(lines) == 1, ended.stderr
    assert lines[0].startswith("cutline: interrupted; last complete checkpoint ")
    assert lines[0].endswith(
        f"; resume with restore_from='latest' (checkpoint_dir={tmp_path / 'ck'})"
    )
    assert "Traceback" not in ended.stderr
    assert len(_sums(tmp_path / "out")) < N  # it stopped part-way (held: it could not end)

    sys.path.insert(0, str(tmp_path))
    try:
        import job  # the same job, built by the same code

        result = testing.execute(
            job.build(tmp_path), launcher=ThreadLauncher(), restore_from="latest"
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("job", None)
    assert result.restored_from is not None
    _assert_exactly_once(_sums(tmp_path / "out"))  # over both runs


def test_ctrl_c_without_a_checkpoint_dir_says_there_is_nothing_to_resume(monkeypatch):
    """In an interactive session the interrupt is an exception (the session goes on)."""
    from cutline.api import execution
    from cutline.runtime.driver.result import JobInterrupted

    def interrupted(self):  # Ctrl-C while the driver runs the job
        raise KeyboardInterrupt

    monkeypatch.setattr(execution, "_interactive", lambda: True)
    monkeypatch.setattr(execution.JobDriver, "_run", interrupted)
    env = StreamEnvironment(2, checkpoint_interval=0.05)
    env.from_sequence(0, 10).collect()
    with pytest.raises(JobInterrupted, match=r"nothing to resume \(the job had no checkpoint_dir"):
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
