"""What ``execute()`` checks before anything runs, so that a job that cannot start right says
so at once: the output directories (apart from one another, and empty unless the job resumes)
and a checkpoint directory that holds a checkpoint to resume (never started over silently)."""

from __future__ import annotations

import fsspec

from cutline.api.dataflow import Dataflow
from cutline.runtime.checkpoint.lineage import (
    ResumableCheckpointError,
    refuse_fresh_start,
    resumable,
)
from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock, Owner
from cutline.runtime.checkpoint.storage import CheckpointStorage


def _storage(job: Dataflow) -> CheckpointStorage:
    assert job.settings.checkpoint_dir is not None
    return CheckpointStorage(
        job.settings.checkpoint_dir, storage_options=job.settings.storage_options
    )


def has_checkpoint(job: Dataflow) -> bool:
    """Whether ``checkpoint_dir`` holds something to resume: a complete checkpoint of its
    current lineage (intact or not: a damaged one is the driver's to report), or what that
    lineage's first run restored."""
    if job.settings.checkpoint_dir is None:
        raise ValueError('restore_from="latest" needs the job\'s checkpoint_dir')
    return resumable(_storage(job)) is not None


def refuse_start_over(job: Dataflow) -> None:
    """A start from the beginning over a checkpoint to resume is refused, before the outputs
    are looked at (the error says both ways on); but a directory in use by a running job
    is that job's, and that is the error to say."""
    try:
        refuse_fresh_start(_storage(job))
    except ResumableCheckpointError:
        settings = job.settings
        assert settings.checkpoint_dir is not None
        probe = CheckpointDirectoryLock(
            settings.checkpoint_dir,
            Owner.this_process("probe"),
            storage_options=dict(settings.storage_options or {}),
        )
        with probe:  # (DirectoryLockedError while another job runs there)
            pass
        raise


def check_outputs(job: Dataflow, restoring: bool, why: str | None = None) -> None:
    """Every output directory apart from the others, and empty unless the job restores (a job
    resumed after its driver died goes on writing where it was)."""
    places = [(job._location(d), f"output directory {d}") for d in job._outputs.values()]
    if job.settings.dead_letter_dir is not None:
        places.append((job._location(job.settings.dead_letter_dir), "dead_letter_dir"))
    for i, (a, what_a) in enumerate(places):
        for b, what_b in places[i + 1 :]:
            if a[0] == b[0] and (
                a[1] == b[1] or b[1].startswith(a[1] + "/") or a[1].startswith(b[1] + "/")
            ):
                raise ValueError(f"{what_a} and {what_b} overlap: give each sink its own directory")
    if restoring:
        return
    for uid, directory in job._outputs.items():
        _check_empty(job, directory, job.graph.operators[uid].name, why)


def _check_empty(job: Dataflow, directory: str, what: str, why: str | None = None) -> None:
    settings = job.settings
    fs, root = fsspec.core.url_to_fs(directory, **dict(settings.storage_options or {}))
    if not fs.exists(root):
        return
    published = [
        p
        for p in fs.ls(root, detail=False)
        if not str(p).rstrip("/").rsplit("/", 1)[-1].startswith(("_", "."))
    ]
    if published:
        advice = (
            f", and {settings.checkpoint_dir} has {why}: the files are not this job's "
            "(another checkpoint_dir?); write to a new directory, or remove them"
            if why is not None  # restore_from="latest" found nothing to resume
            else "; write to a new directory, or remove them first (the exactly-once "
            "sink never overwrites output), or resume the job that wrote them "
            "(restore_from=...)"
        )
        raise ValueError(
            f"{what}: output directory {directory} already holds {len(published)} file(s){advice}"
        )
