"""Every checkpoint a test's job takes is verified in full as soon as its metadata is written:
every file read and checked, the channel state counted, the cut checked channel by channel
(``runtime/checkpoint/verify.py``). ``conftest.py`` gives every job :func:`verify_written` as its
``JobConfig.checkpoint_written`` hook; a test fails when one of its checkpoints did not verify.
"""

from __future__ import annotations

from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.verify import verify_checkpoint

FAILURES: list[str] = []
"""What failed verification since the running test started."""
VERIFIED = [0]
"""Checkpoints verified in this process."""


def verify_written(checkpoint: int, location: CheckpointLocation) -> None:
    try:
        verification = verify_checkpoint(location, checkpoint)
    except StorageError as exc:
        FAILURES.append(f"checkpoint {checkpoint} could not be read: {exc}")
        return
    VERIFIED[0] += 1
    if not verification.ok:
        FAILURES.append(verification.summary())
