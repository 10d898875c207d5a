"""The checkpoint verifier (``runtime/verify.py``) on real checkpoints and on tampered ones.

Real checkpoints of every checkpointing mode (and of a job with a loop, whose back edge is
recorded as channel state) must pass. A copy of a checkpoint directory is then damaged in one
way at a time, and the verification must fail naming what was damaged: a channel count in the
metadata, a record taken out of a state file's channel state (with the digest fixed up, so that
only the counting can tell), a truncated state file, a deleted or altered segment, unreadable
metadata, a handle without channel counts (an older version's checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_checkpoint_stats import N, environment, keyed_job
from test_savepoints import SavepointOnHold, endpoints_of, half_of_each_subtask

import checkpoint_verification
from cutline import Checkpoints, JobClient, SourceHold, StreamEnvironment, testing
from cutline.api.environment import DataStream
from cutline.examples.connected_components import (
    Propagate,
    as_output,
    both_directions,
    edge_stream,
    expected_labels,
    is_label,
    is_output,
    vertex_of,
)
from cutline.protocol.cut import ChannelCut, CutViolation
from cutline.runtime.checkpoint.layout import METADATA, SHARED
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.checkpoint.verify import Verification, verify_checkpoint
from cutline.runtime.task.local import ThreadLauncher

JOBS = [
    "aligned",
    "unaligned",
    "aligned-timeout",
    "at_least_once",
    "loop-unaligned",
    "loop-at_least_once",
]
EDGES, VERTICES = 1_500, 1_000


def pace(record: Any) -> Any:
    """Passes a record on, a little slowly: the loop stays busy while checkpoints come."""
    time.sleep(0.0002)
    return record


def paced_loop(loop: DataStream) -> tuple[DataStream, DataStream]:
    """The body of connected components (``examples/connected_components.py``), with a slow
    back edge."""
    messages = loop.key_by(vertex_of).process(Propagate(), name="propagate")
    feedback = messages.filter(is_label, name="feedback").map(pace, name="pace")
    return feedback, messages.filter(is_output).map(as_output, name="label_drops")


@dataclass
class Directory:
    """A finished job's checkpoint directory, every checkpoint retained."""

    job: str
    root: Path
    plan_channels: set[str]

    @property
    def storage(self) -> CheckpointStorage:
        return CheckpointStorage(str(self.root))

    def checkpoints(self) -> list[int]:
        return self.storage.completed_ids()


def run(directory: Path, job: str) -> Directory:
    """Run ``job`` (a checkpointing mode; ``loop-MODE``: connected components in that mode)
    with every checkpoint retained. Its sources hold half-way until a checkpoint completed:
    there are two complete checkpoints at least (that one and the final one)."""
    if job.startswith("loop-"):
        hold = SourceHold(records=EDGES // 4)  # half of each source subtask's edges
        env = StreamEnvironment(
            2,
            checkpoints=Checkpoints(
                interval=0.02,
                dir=directory / "checkpoints",
                mode=job.removeprefix("loop-"),
                retained=1000,
            ),
            batch_size=20,
        )
        edge_stream(env, edges=EDGES, vertices=VERTICES).flat_map(both_directions).iterate(
            paced_loop
        ).collect()
    else:
        hold = SourceHold(records=N // 4)
        env = environment(directory, job)
        keyed_job(env, 0.02, None)
    before = len(checkpoint_verification.FAILURES)
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=hold)
    assert checkpoint_verification.FAILURES[before:] == []  # (the driver verified them too)
    if job.startswith("loop-"):
        labels: dict[int, int] = {}
        for r in result.output:
            labels[r["vertex"]] = min(r["label"], labels.get(r["vertex"], r["label"]))
        assert labels == expected_labels(EDGES, VERTICES)
    plan = env.plan()
    channels = {
        c
        for chain in plan.chains
        for index in range(plan.parallelism)
        for c in plan.input_channels(chain, index)
    }
    return Directory(job, directory / "checkpoints", channels)


class Directories:
    """Each job's checkpoint directory; a job runs when first asked for (once per module)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.done: dict[str, Directory] = {}

    def __getitem__(self, job: str) -> Directory:
        if job not in self.done:
            self.done[job] = run(self.factory.mktemp(job), job)
        return self.done[job]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> Directories:
    """The jobs' checkpoint directories, shared by the tests of this module."""
    return Directories(tmp_path_factory)


# ------------------------------------------------------------------------ real checkpoints


@pytest.mark.parametrize("job", JOBS)
def test_every_real_checkpoint_verifies(directories: Directories, job: str) -> None:
    directory = directories[job]
    ids = directory.checkpoints()
    assert len(ids) >= 2
    in_flight = 0
    for checkpoint_id in ids:
        location = directory.storage.location(checkpoint_id)
        verification = verify_checkpoint(location, checkpoint_id)
        assert verification.ok, verification.summary()
        assert verification.checkpoint_id == checkpoint_id
        assert verification.problems == [] and verification.violations == []
        metadata = location.read_metadata()
        assert verification.files == len(metadata.handles) + sum(
            len(h.segments) for h in metadata.handles.values()
        )
        # every channel of the plan, each checked
        assert {c.channel for c in verification.channels} == directory.plan_channels
        at_least_once = job.endswith("at_least_once")
        assert verification.checkpointing == (
            "at_least_once"
            if at_least_once
            else ("unaligned" if job.endswith("unaligned") else "aligned")
        )
        summary = verification.summary()
        assert summary.startswith(f"checkpoint {checkpoint_id}: OK — {verification.files} files")
        assert ("nothing lost" if at_least_once else "a consistent cut") in summary
        in_flight += sum(c.in_flight for c in verification.channels)
    if job in ("unaligned", "loop-unaligned", "loop-at_least_once"):
        assert in_flight > 0, "some checkpoint recorded records in flight"
    if job == "aligned":
        assert in_flight == 0


def test_a_savepoint_folder_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment(tmp_path, "unaligned", batch_size=10)
    keyed_job(env, 0.0, None)  # (no need to be slow: the savepoint comes while it holds)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(tmp_path / "sp"),
    )
    testing.execute(
        env, launcher=ThreadLauncher(), listener=asking, hold_sources=half_of_each_subtask(N, 2)
    )
    path = asking.answer()
    assert isinstance(path, str), path
    # moved elsewhere: a savepoint is self-contained
    moved = tmp_path / "elsewhere"
    shutil.move(path, moved)
    verification = verify_checkpoint(CheckpointLocation.open(str(moved)))
    assert verification.ok, verification.summary()
    assert verification.checkpoint_id is not None
    assert verification.summary().startswith(f"checkpoint {verification.checkpoint_id}: OK")
    assert {c.channel for c in verification.channels}  # the cut was checked


# ------------------------------------------------------------------------------- tampering


@dataclass
class Copy:
    """A copy of a checkpoint directory, and one of its checkpoints to damage."""

    root: Path
    checkpoint_id: int

    @property
    def folder(self) -> Path:
        return self.root / f"chk-{self.checkpoint_id}"

    def metadata(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / METADATA).read_bytes())
        return data

    def write_metadata(self, data: dict[str, Any]) -> None:
        (self.folder / METADATA).write_text(json.dumps(data, indent=1, sort_keys=True))

    def verify(self) -> Verification:
        storage = CheckpointStorage(str(self.root))
        return verify_checkpoint(storage.location(self.checkpoint_id), self.checkpoint_id)


def recorded(handle: dict[str, Any], side: str) -> dict[str, int]:
    """A metadata handle's recorded records per channel on ``side`` (inputs or outputs)."""
    return dict(handle.get("channels", {}).get(f"recorded_{side}", {}))


@pytest.fixture
def damaged(directories: Directories, tmp_path: Path) -> Copy:
    """A copy of the unaligned job's checkpoints; the checkpoint to damage records channel
    state on both sides (inputs and outputs) and names shared segments."""
    source = directories["unaligned"]
    root = tmp_path / "copy"
    shutil.copytree(source.root, root)
    for checkpoint_id in source.checkpoints():
        copy = Copy(root, checkpoint_id)
        handles = copy.metadata()["handles"].values()
        if (
            any(recorded(h, "inputs") for h in handles)
            and any(recorded(h, "outputs") for h in handles)
            and any(r["path"].startswith("../shared/") for h in handles for r in h["segments"])
        ):
            assert copy.verify().ok
            return copy
    raise AssertionError("no checkpoint with channel state on both sides and shared segments")


def test_the_copy_verifies_before_it_is_damaged(damaged: Copy) -> None:
    assert damaged.verify().ok


@pytest.mark.parametrize(
    ("count", "delta", "what"),
    [
        ("sent", 1, "1 lost"),
        ("received", 2, "2 counted after the cut"),
        ("received", -1, "1 lost"),
    ],
)
def test_a_changed_channel_count_in_the_metadata_names_the_channel(
    damaged: Copy, count: str, delta: int, what: str
) -> None:
    data = damaged.metadata()
    subtask, channel = next(
        (s, c)
        for s, h in sorted(data["handles"].items())
        for c, n in sorted(h["channels"][count].items())
        if n > 1
    )
    data["handles"][subtask]["channels"][count][channel] += delta
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert not verification.ok
    assert verification.problems == []
    assert [v.channel for v in verification.violations] == [channel]
    assert verification.violations[0].message.endswith(f"({what})")
    assert f"channel {channel}: " in verification.summary()
    assert verification.summary().startswith(f"checkpoint {damaged.checkpoint_id}: FAILED — ")


def test_a_recorded_count_in_the_metadata_that_the_state_file_contradicts_is_named(
    damaged: Copy,
) -> None:
    data = damaged.metadata()
    subtask, handle = next(
        (s, h) for s, h in sorted(data["handles"].items()) if recorded(h, "inputs")
    )
    channel, n = sorted(recorded(handle, "inputs").items())[0]
    handle["channels"]["recorded_inputs"][channel] = n + 3
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert verification.problems == [
        f"{subtask}: its acknowledgement says {n + 3} records recorded on input channel "
        f"{channel}, its state file holds {n}"
    ]
    # the cut is checked with what the state file holds: that adds up
    assert verification.violations == []


def without_one_record(batch: Any) -> Any:
    """``batch`` (a list of records or an Arrow record batch) without its first record."""
    if isinstance(batch, pa.RecordBatch):
        return batch.slice(1)
    return batch[1:]


@pytest.mark.parametrize("side", ["inputs", "outputs"])
def test_a_record_taken_out_of_the_channel_state_is_caught_by_counting(
    damaged: Copy, side: str
) -> None:
    data = damaged.metadata()
    subtask, handle = next((s, h) for s, h in sorted(data["handles"].items()) if recorded(h, side))
    channel, n = sorted(recorded(handle, side).items())[0]
    state = damaged.folder / handle["path"]
    payload = pickle.loads(state.read_bytes())
    batches = payload["channels"][side][channel]
    batches[0] = without_one_record(batches[0])
    raw = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    state.write_bytes(raw)
    # the digest and size fixed up: the file is "intact", only the counting can tell
    handle["size"], handle["sha256"] = len(raw), hashlib.sha256(raw).hexdigest()
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert not verification.ok
    kind = side.removesuffix("s")
    assert verification.problems == [
        f"{subtask}: its acknowledgement says {n} records recorded on {kind} channel {channel}, "
        f"its state file holds {n - 1}"
    ]
    assert [v.channel for v in verification.violations] == [channel]
    assert verification.violations[0].message.endswith("(1 lost)")
    assert subtask in verification.summary() and channel in verification.summary()


def test_a_truncated_state_file_is_named(damaged: Copy) -> None:
    data = damaged.metadata()
    handle = data["handles"][sorted(data["handles"])[0]]
    state = damaged.folder / handle["path"]
    state.write_bytes(state.read_bytes()[:-10])
    verification = damaged.verify()
    assert verification.problems == [
        f"state file {state} has {handle['size'] - 10} bytes, the metadata says {handle['size']}"
    ]
    assert verification.channels == []  # without every subtask's counts: no cut to check
    assert str(state) in verification.summary()


def a_shared_segment(copy: Copy) -> Path:
    """A shared segment the damaged checkpoint names."""
    for handle in sorted(copy.metadata()["handles"].values(), key=lambda h: h["path"]):
        for ref in handle["segments"]:
            if ref["path"].startswith("../shared/"):
                return copy.root / SHARED / ref["path"].removeprefix("../shared/")
    raise AssertionError("no shared segment")


def test_a_deleted_segment_is_named(damaged: Copy) -> None:
    segment = a_shared_segment(damaged)
    segment.unlink()
    verification = damaged.verify()
    assert verification.problems == [f"state segment {segment} is missing"]
    assert str(segment) in verification.summary()


def test_an_altered_segment_is_named(damaged: Copy) -> None:
    segment = a_shared_segment(damaged)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit pattern changed
    segment.write_bytes(bytes(data))
    verification = damaged.verify()
    assert len(verification.problems) == 1
    assert str(segment) in verification.problems[0]
    assert "does not match the digest in the metadata" in verification.problems[0]


def test_a_resized_segment_is_named_with_both_sizes(damaged: Copy) -> None:
    segment = a_shared_segment(damaged)
    size = segment.stat().st_size
    segment.write_bytes(segment.read_bytes() + b"x")
    verification = damaged.verify()
    (problem,) = verification.problems
    assert problem.endswith(f"{segment} has {size + 1} bytes, the metadata says {size}")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{not json", "is not valid checkpoint metadata"),
        (b'{"format": 99}', "unknown format 99"),
        (b'{"format": 1, "checkpoint_id": 1}', "older version of cutline (format 1)"),
    ],
)
def test_unreadable_metadata_is_named(damaged: Copy, content: bytes, expected: str) -> None:
    (damaged.folder / METADATA).write_bytes(content)
    verification = damaged.verify()
    assert not verification.ok
    (problem,) = verification.problems
    assert str(damaged.folder / METADATA) in problem
    assert expected in problem
    assert verification.files == 0 and verification.channels == []
    assert verification.summary().startswith(f"checkpoint {damaged.checkpoint_id}: FAILED")


def test_missing_metadata_says_the_checkpoint_is_incomplete(damaged: Copy) -> None:
    (damaged.folder / METADATA).unlink()
    (problem,) = damaged.verify().problems
    assert problem == (
        f"checkpoint {damaged.checkpoint_id} is incomplete: {damaged.folder / METADATA} does "
        "not exist"
    )


def test_metadata_of_another_checkpoint_is_named(damaged: Copy) -> None:
    data = damaged.metadata()
    data["checkpoint_id"] += 1000
    damaged.write_metadata(data)
    (problem,) = damaged.verify().problems
    assert f"it describes checkpoint {damaged.checkpoint_id + 1000}" in problem


def test_a_handle_without_channel_counts_is_an_older_version_s(damaged: Copy) -> None:
    data = damaged.metadata()
    subtask, handle = sorted(data["handles"].items())[-1]
    del handle["channels"]
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert verification.problems == [
        f"{subtask}: no channel counts (written by an older version of cutline): the cut "
        "cannot be verified"
    ]
    assert verification.channels == [] and verification.violations == []
    assert "older version" in verification.summary()


def test_a_subtask_missing_from_the_metadata_is_caught_on_each_of_its_channels(
    damaged: Copy,
) -> None:
    data = damaged.metadata()
    subtask = next(
        s
        for s, h in sorted(data["handles"].items())
        if h["channels"]["sent"] and h["channels"]["received"]
    )
    counts = data["handles"].pop(subtask)["channels"]
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert verification.problems == []
    side = {c: "sender" for c in counts["sent"]} | {c: "receiver" for c in counts["received"]}
    assert [(v.channel, v.message) for v in verification.violations] == [
        (c, f"its {side[c]} reported no count (a subtask is missing)") for c in sorted(side)
    ]


def test_a_failed_summary_counts_every_problem_and_shows_the_first(damaged: Copy) -> None:
    data = damaged.metadata()
    for handle in list(data["handles"].values())[1:]:  # one subtask keeps its counts
        del handle["channels"]
    damaged.write_metadata(data)
    verification = damaged.verify()
    n = len(data["handles"]) - 1
    assert len(verification.problems) == n > 1
    assert verification.summary() == (
        f"checkpoint {damaged.checkpoint_id}: FAILED — {n} problem(s); the first: "
        f"{verification.problems[0]}"
    )


def test_a_verification_with_a_violation_and_no_problem_is_not_ok() -> None:
    cut = ChannelCut("a>b:0>0", sent=1, received=0)
    verification = Verification(3, "somewhere", channels=[cut])
    assert verification.ok
    verification.violations.append(CutViolation("a>b:0>0", "1 lost"))
    assert not verification.ok
    assert verification.summary().startswith("checkpoint 3: FAILED — 1 problem(s)")
    assert verification.summary().endswith("channel a>b:0>0: 1 lost")


def test_an_older_version_s_checkpoint_has_its_files_checked_but_not_its_cut(
    damaged: Copy,
) -> None:
    data = damaged.metadata()
    for handle in data["handles"].values():
        del handle["channels"]
    damaged.write_metadata(data)
    verification = damaged.verify()
    assert verification.ok and not verification.cut_checked
    assert verification.problems == [] and verification.channels == []
    assert verification.summary().endswith(
        "files intact; the cut was not checked (written by an older version of cutline, "
        "without channel counts)"
    )
