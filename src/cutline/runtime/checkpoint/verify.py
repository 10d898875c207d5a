"""Verify a checkpoint on disk: every file intact, and the state a consistent cut.

:func:`verify_checkpoint` checks, for one checkpoint or savepoint folder,

1. **integrity**: the metadata is readable; every state file and every keyed state segment
   it names is there with the size and SHA-256 digest the metadata gives;
2. **the channel state**: each subtask's state file holds, per channel, as many recorded
   records as its acknowledgement said;
3. **the cut**: for every channel, records sent before the barrier = records received before
   the snapshot + records recorded in flight (``protocol/cut.py``), with the recorded
   records counted in the state files themselves. An at-least-once checkpoint is checked
   for *nothing lost* only.

Each problem names the file or the channel. ``cutline checkpoints verify`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cutline.protocol.cut import ChannelCut, CutViolation, channel_cuts, check_cut
from cutline.runtime.checkpoint.layout import CorruptCheckpointError, StorageError
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError


@dataclass
class Verification:
    """What :func:`verify_checkpoint` found."""

    checkpoint_id: int | None
    url: str
    checkpointing: str = "aligned"
    channels: list[ChannelCut] = field(default_factory=list)
    files: int = 0
    """State files and segments checked."""
    problems: list[str] = field(default_factory=list)
    """Damaged or missing files, channel state that disagrees with its counts."""
    violations: list[CutViolation] = field(default_factory=list)
    """Channels on which the cut is not consistent."""
    cut_checked: bool = True
    """``False`` for a checkpoint written by a version of cutline without channel counts: its
    files were checked, its cut cannot be."""

    @property
    def ok(self) -> bool:
        return not self.problems and not self.violations

    def summary(self) -> str:
        what = f"checkpoint {self.checkpoint_id}" if self.checkpoint_id is not None else self.url
        if self.ok and not self.cut_checked:
            return (
                f"{what}: OK — {self.files} files intact; the cut was not checked (written by an "
                "older version of cutline, without channel counts)"
            )
        if self.ok:
            in_flight = sum(c.in_flight for c in self.channels)
            cut = (
                "nothing lost (at-least-once: not a consistent cut by design)"
                if self.checkpointing == "at_least_once"
                else "a consistent cut"
            )
            return (
                f"{what}: OK — {self.files} files intact; {cut} on all "
                f"{len(self.channels)} channels ({in_flight} records in flight recorded)"
            )
        found = [*self.problems, *(str(v) for v in self.violations)]
        return f"{what}: FAILED — {len(found)} problem(s); the first: {found[0]}"


def verify_checkpoint(
    location: CheckpointLocation, checkpoint_id: int | None = None
) -> Verification:
    """Verify the checkpoint or savepoint in ``location`` (see the module's text). Raises
    :class:`StorageError` only for an I/O error that may pass (not for damage: that is a
    problem in the result)."""
    result = Verification(checkpoint_id, location.url)
    try:
        reader = CheckpointReader(location, checkpoint_id)
    except InspectError as exc:
        result.problems.append(str(exc))
        return result
    metadata = reader.metadata
    result.checkpoint_id = metadata.checkpoint_id
    result.checkpointing = str(metadata.extra.get("checkpointing", "aligned"))
    counts = {}
    result.cut_checked = any(h.channels is not None for h in metadata.handles.values())
    for subtask, handle in sorted(metadata.handles.items()):
        try:
            location.read_state(handle)
            result.files += 1
        except CorruptCheckpointError as exc:
            result.problems.append(str(exc))
            continue
        for ref in handle.segments:
            try:
                location.read_segment(ref)
                result.files += 1
            except CorruptCheckpointError as exc:
                result.problems.append(str(exc))
            except ValueError as exc:  # a path that is not a segment's
                result.problems.append(f"{subtask}: {exc}")
        if handle.channels is None:
            if not result.cut_checked:
                continue  # an older version's checkpoint: no subtask counted
            result.problems.append(
                f"{subtask}: no channel counts (written by an older version of cutline): the "
                "cut cannot be verified"
            )
            continue
        try:
            inputs, outputs = reader.recorded_counts(subtask)
        except (CorruptCheckpointError, InspectError) as exc:
            result.problems.append(str(exc))
            continue
        for side, claimed, found in (
            ("input", handle.channels["recorded_inputs"], inputs),
            ("output", handle.channels["recorded_outputs"], outputs),
        ):
            for channel in sorted(set(claimed) | set(found)):
                if claimed.get(channel, 0) != found.get(channel, 0):
                    result.problems.append(
                        f"{subtask}: its acknowledgement says {claimed.get(channel, 0)} records "
                        f"recorded on {side} channel {channel}, its state file holds "
                        f"{found.get(channel, 0)}"
                    )
        counts[subtask] = {
            "sent": handle.channels["sent"],
            "received": handle.channels["received"],
            "recorded_inputs": inputs,
            "recorded_outputs": outputs,
        }
    if result.cut_checked and len(counts) == len(metadata.handles):
        result.channels = channel_cuts(counts)
        result.violations = check_cut(
            result.channels, at_least_once=result.checkpointing == "at_least_once"
        )
    return result


__all__ = ["StorageError", "Verification", "verify_checkpoint"]
