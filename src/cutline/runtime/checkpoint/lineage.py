"""Which checkpoints of a directory a job resumes, and which it must never delete.

A checkpoint directory holds one job's checkpoints run after run. A run that **resumes**
(``restore_from="latest"``, the directory, or its newest checkpoint) continues them: it
starts from the newest, and ``Checkpoints.retained`` counts them with its own (the oldest go
as it completes its own, as Spark's checkpoint location does).

A run that does not resume begins a new **lineage**: started from the beginning
(``fresh=True``) or from a savepoint or a checkpoint elsewhere. The checkpoints before it
are another run's: it never deletes them (as Flink keeps a retained checkpoint), and it
writes ``_lineage`` in the directory, saying where the new lineage begins (the first
checkpoint id it may write) and what it restored. From then on "the newest checkpoint" of
the directory means the newest of that lineage; while it has none, resuming restores what
its first run restored (or starts from the beginning). An earlier lineage's checkpoints
stay where they are, to be restored by their folder (``restore_from="ck/chk-7"``) or
removed by hand.

A run without ``restore_from`` over a directory with something to resume is refused
(:class:`ResumableCheckpointError`) before anything starts: it would start from the
beginning and publish again what that checkpoint covers.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass

from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.storage import CheckpointStorage

LINEAGE = "_lineage"
"""The file in a checkpoint directory that says where its current lineage begins."""


class ResumableCheckpointError(Exception):
    """A job was started without ``restore_from`` on a checkpoint directory holding a
    checkpoint it can resume from: say which way on (resume, or start fresh)."""


@dataclass(frozen=True)
class Lineage:
    """Where a directory's current lineage begins."""

    since: int
    """Its first checkpoint id: those below belong to earlier lineages."""
    restored_from: str | None
    """What its first run restored (a savepoint's or checkpoint's folder); ``None``: it started
    from the beginning."""
    run: str
    """The run that began it."""
    started: float
    """When (seconds since the epoch)."""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "since": self.since,
                "restored_from": self.restored_from,
                "run": self.run,
                "started": self.started,
            },
            indent=1,
        ).encode()


@dataclass(frozen=True)
class Resumable:
    """What a run resuming a directory starts from."""

    url: str
    """The checkpoint's or savepoint's folder."""
    checkpoint_id: int | None
    """The directory's checkpoint (``None``: a savepoint, or the savepoint or checkpoint
    elsewhere that the lineage's first run restored, and no checkpoint of the lineage
    completed since)."""
    savepoint: int | None = None
    """The savepoint's id, when it is a savepoint the lineage took after its newest
    checkpoint (a stop with a savepoint): its sinks may have committed what it covers, so a
    resumed run goes on from it, never from an older checkpoint."""

    def describe(self) -> str:
        if self.checkpoint_id is not None:
            return f"complete checkpoint {self.checkpoint_id} of an earlier run ({self.url})"
        if self.savepoint is not None:
            return f"savepoint {self.savepoint} of an earlier run ({self.url})"
        return (
            f"no complete checkpoint since an earlier run restored {self.url}, "
            "which a resumed run restores again"
        )


def read_lineage(storage: CheckpointStorage) -> Lineage | None:
    """The directory's current lineage, if a run began one there."""
    path = f"{storage.root}/{LINEAGE}"
    try:
        if not storage.fs.exists(path):
            return None
        with storage.fs.open(path, "rb") as source:
            data = json.loads(source.read())
        return Lineage(
            int(data["since"]),
            None if data.get("restored_from") is None else str(data["restored_from"]),
            str(data.get("run", "")),
            float(data.get("started", 0.0)),
        )
    except OSError as exc:
        raise StorageError(f"cannot read {storage.url_of(path)}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(
            f"{storage.url_of(path)} is damaged ({exc}): it says where this directory's "
            f"checkpoints of the current run begin; remove it to count every checkpoint there"
        ) from None


def begin_lineage(
    storage: CheckpointStorage, since: int, restored_from: str | None, run: str
) -> Lineage:
    """Begin a new lineage at checkpoint ``since`` (written atomically)."""
    lineage = Lineage(since, restored_from, run, time.time())
    storage.replace_file(storage.root, LINEAGE, lineage.encode(), "where its lineage begins")
    return lineage


@dataclass(frozen=True)
class Standing:
    """A directory as a run finds it (read once): its lineage, its complete checkpoints, and
    what a run resuming it starts from."""

    lineage: Lineage | None
    completed: list[int]
    """Every complete checkpoint there, of any lineage."""
    resumable: Resumable | None
    """The newest complete checkpoint of the current lineage, else what that lineage's first
    run restored; ``None``: nothing (a resumed run starts from the beginning)."""

    @property
    def since(self) -> int:
        """The current lineage's first checkpoint id (0: every one counts)."""
        return 0 if self.lineage is None else self.lineage.since


def standing(storage: CheckpointStorage) -> Standing:
    lineage = read_lineage(storage)
    completed = storage.completed_ids()
    since = 0 if lineage is None else lineage.since
    mine = [c for c in completed if c >= since]
    found = None
    later = _savepoint_after(storage, mine[-1] if mine else since - 1)
    if later is not None:
        found = Resumable(later[1], None, later[0])
    elif mine:
        found = Resumable(storage.url_of(storage.checkpoint_path(mine[-1])), mine[-1])
    elif lineage is not None and lineage.restored_from is not None:
        found = Resumable(lineage.restored_from, None)
    return Standing(lineage, completed, found)


def _savepoint_after(storage: CheckpointStorage, newest: int) -> tuple[int, str] | None:
    """The newest savepoint taken after checkpoint ``newest`` that the directory's statistics
    record as completed (its id and folder), if any: what the job stopped with."""
    for checkpoint_id in reversed(storage.stats_checkpoint_ids()):
        if checkpoint_id <= newest:
            return None
        try:
            record = storage.checkpoint_stats(checkpoint_id)
        except StorageError:  # (unreadable statistics: `checkpoints list` names them)
            continue
        if record is not None and record.completed and record.savepoint:
            return checkpoint_id, record.savepoint
    return None


def resumable(storage: CheckpointStorage) -> Resumable | None:
    """What a run resuming the directory starts from (:attr:`Standing.resumable`)."""
    return standing(storage).resumable


def summary(storage: CheckpointStorage) -> list[str]:
    """What ``restore_from="latest"`` resumes in the directory, and, if a run began a new
    lineage there, which checkpoints are an earlier one's (for ``cutline checkpoints list``)."""
    now = standing(storage)
    found, lineage = now.resumable, now.lineage
    if found is None:
        lines = ["restore_from='latest' finds nothing to resume: it starts from the beginning"]
    elif found.checkpoint_id is not None:
        lines = [f"restore_from='latest' resumes checkpoint {found.checkpoint_id}"]
    elif found.savepoint is not None:
        lines = [f"restore_from='latest' restores savepoint {found.savepoint} ({found.url})"]
    else:
        lines = [f"restore_from='latest' restores {found.url}, where this lineage began"]
    if lineage is not None and lineage.since > 1:
        lines.append(
            f"checkpoints below {lineage.since} are of runs before a fresh start or a restore "
            "from elsewhere: kept, restored only by their folder"
        )
    return lines


def refuse_fresh_start(storage: CheckpointStorage, now: Standing | None = None) -> None:
    """Raise :class:`ResumableCheckpointError` if the directory (as ``now`` found it, else as
    it is read now) holds something to resume: a run without ``restore_from`` must say whether
    it resumes or starts again."""
    found = (now or standing(storage)).resumable
    if found is None:
        return
    when = ""
    if found.checkpoint_id is not None:
        try:
            stamp = storage.read_metadata(found.checkpoint_id).extra.get("time")
        except StorageError:
            stamp = None
        if isinstance(stamp, int | float):
            at = dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            when = f", taken {at}"
    raise ResumableCheckpointError(
        f"checkpoint_dir {storage.url} holds {found.describe()}{when}. Resume it with "
        "execute(restore_from='latest'), or start again from the beginning with "
        "execute(fresh=True) (the earlier checkpoints are kept, never deleted; the output "
        "directories must then be new or empty)"
    )
