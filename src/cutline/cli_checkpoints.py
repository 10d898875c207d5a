"""``cutline checkpoints list | show | diff | verify`` and ``cutline report``: look into a
checkpoint directory.

* ``list DIR`` — every checkpoint in the statistics (``DIR/_stats``; also those discarded
  since) and every checkpoint folder: status, duration, size, channel state, on disk or not;
  and the restarts.
* ``show DIR ID`` — one checkpoint: its statistics per subtask, the critical path (which
  input's barrier came last, hop by hop back to a source), its operators and their state,
  its channel state.
* ``diff DIR A B`` — the keyed state that differs between checkpoints A and B, key by key.
* ``verify DIR [ID]`` — every file intact and a consistent cut on every channel
  (``runtime/checkpoint/verify.py``); exit status 1 if one is not, or if a checkpoint's folder lost its
  ``_metadata`` though its statistics say it completed.
* ``report DIR -o report.html`` — the page with plots, the critical paths and a space-time
  diagram of one checkpoint's barriers.

``ID`` is a checkpoint id or ``latest`` (the newest complete one).

Here are the commands: their arguments checked (a :class:`Directory`), what they read and
their exit status; the tables and lines they print are :mod:`cutline.cli_render`'s.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.text import Text

from cutline.cli_render import (
    checkpoints_table,
    make_console,
    print_contents,
    print_restarts,
    print_stats,
)
from cutline.runtime.checkpoint.layout import METADATA, CorruptCheckpointError, StorageError
from cutline.runtime.checkpoint.lineage import summary as lineage_summary
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError
from cutline.runtime.checkpoint.stats import History, id_ranges
from cutline.runtime.checkpoint.storage import CheckpointStorage

EXIT_OK, EXIT_UNVERIFIED, EXIT_BAD_INPUT = 0, 1, 2


def _fail(message: str) -> NoReturn:
    click.echo(f"cutline: error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


class Directory:
    """A checkpoint directory given on the command line, checked to be one."""

    def __init__(self, url: str) -> None:
        try:
            self.storage = CheckpointStorage(url)
            fs, root = self.storage.fs, self.storage.root
            if not fs.exists(root):
                _fail(f"{url} does not exist")
            if not fs.isdir(root):
                _fail(f"{url} is not a directory")
            if fs.exists(f"{root}/{METADATA}"):
                _fail(
                    f"{url} is one checkpoint or savepoint folder, not a checkpoint directory: "
                    "give the directory that holds it (chk-N folders and _stats), or verify "
                    "it alone with `cutline checkpoints verify FOLDER`"
                )
            self.ids = self.storage.checkpoint_ids()
            self.history: History = self.storage.read_history()
        except StorageError as exc:
            _fail(str(exc))
        self.url = url
        if not self.ids and not (
            self.history.checkpoints or self.history.runs or self.history.restarts
        ):
            _fail(
                f"{url} is not a cutline checkpoint directory: it has no chk-N folders and no "
                "_stats folder (give the checkpoint_dir of a job)"
            )

    def completed(self) -> list[int]:
        try:
            return self.storage.completed_ids()
        except StorageError as exc:
            _fail(str(exc))

    @functools.cached_property
    def lost(self) -> list[int]:
        """The checkpoints whose folder lost its metadata though their statistics say they
        completed (``CheckpointStorage.completed_without_metadata``)."""
        try:
            return self.storage.completed_without_metadata()
        except StorageError as exc:
            _fail(str(exc))

    def checkpoint_id(self, text: str) -> int:
        """The id ``text`` names (a number, or ``latest``)."""
        if text == "latest":
            completed = self.completed()
            if not completed:
                _fail(f"{self.url} has no complete checkpoint")
            return completed[-1]
        try:
            value = int(text)
        except ValueError:
            _fail(f"{text!r} is not a checkpoint id (a number, or 'latest')")
        if value < 0:
            _fail(f"{text!r} is not a checkpoint id (a number, or 'latest')")
        if value not in self.ids and self.history.checkpoint(value) is None:
            _fail(
                f"{self.url} has no checkpoint {value} (ids with statistics: "
                f"{id_ranges([s.checkpoint_id for s in self.history.checkpoints])}; "
                f"folders: {id_ranges(self.ids)})"
            )
        return value

    def location(self, checkpoint_id: int) -> CheckpointLocation | None:
        """Where checkpoint ``checkpoint_id`` is on disk (its folder, or its savepoint's), or
        ``None`` when it is gone (discarded)."""
        if checkpoint_id in self.ids and self.storage.is_complete(checkpoint_id):
            return self.storage.location(checkpoint_id)
        stats = self.history.checkpoint(checkpoint_id)
        if stats is not None and stats.savepoint:
            location = CheckpointLocation.open(stats.savepoint)
            if location.fs.exists(f"{location.folder}/{METADATA}"):
                return location
        return None

    def reader(self, checkpoint_id: int) -> CheckpointReader:
        location = self.location(checkpoint_id)
        if location is None and checkpoint_id in self.lost:
            _fail(self.storage.missing_metadata_reason(checkpoint_id))
        if location is None:
            _fail(
                f"checkpoint {checkpoint_id} is not on disk any more (only the newest "
                f"Checkpoints.retained stay; complete ones now: "
                f"{id_ranges(self.completed())}); its statistics remain: "
                f"`cutline checkpoints show {self.url} {checkpoint_id}`"
            )
        try:
            return CheckpointReader(location, None)
        except InspectError as exc:
            _fail(str(exc))


@click.group()
def checkpoints() -> None:
    """Look into a checkpoint directory: list, show, diff and verify its checkpoints."""


# -------------------------------------------------------------------------------- list


@checkpoints.command("list")
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def list_checkpoints(directory: str, as_json: bool) -> None:
    """Every checkpoint of DIRECTORY (with statistics, also those discarded since), and the
    restarts."""
    folder = Directory(directory)
    completed = set(folder.completed())
    lost = set(folder.lost)
    known = {s.checkpoint_id: s for s in folder.history.checkpoints}
    if as_json:
        click.echo(
            json.dumps(
                {
                    "checkpoints": [
                        {
                            **s.to_dict(),
                            "on_disk": folder.location(s.checkpoint_id) is not None,
                            "metadata_missing": s.checkpoint_id in lost,
                        }
                        for s in folder.history.checkpoints
                    ],
                    "without_statistics": sorted(completed - set(known)),
                    "metadata_missing": sorted(lost),
                    "restarts": [r.to_dict() for r in folder.history.restarts],
                    "runs": [r.to_dict() for r in folder.history.runs],
                    "unreadable": folder.history.unreadable,
                },
                indent=1,
            )
        )
        return
    console = make_console()
    rows = [
        (checkpoint_id, known.get(checkpoint_id), folder.location(checkpoint_id) is not None)
        for checkpoint_id in sorted(set(known) | completed)
    ]
    console.print(checkpoints_table(f"checkpoints of {directory}", rows, lost))
    for line in lineage_summary(folder.storage):
        console.print(Text(line), soft_wrap=True)
    for checkpoint_id in sorted(lost):
        reason = folder.storage.missing_metadata_reason(checkpoint_id)
        console.print(
            Text(f"incomplete: {reason}; it is never restored from", style="yellow"),
            soft_wrap=True,  # the path whole: the terminal wraps it
        )
    print_restarts(console, folder.history.restarts)
    for problem in folder.history.unreadable:
        console.print(Text(f"unreadable: {problem}", style="yellow"))


# -------------------------------------------------------------------------------- show


@checkpoints.command()
@click.argument("directory")
@click.argument("checkpoint_id", metavar="ID")
def show(directory: str, checkpoint_id: str) -> None:
    """Checkpoint ID of DIRECTORY: why it took as long as it did (per subtask, and the
    critical path), its operators' state and its channel state."""
    folder = Directory(directory)
    n = folder.checkpoint_id(checkpoint_id)
    console = make_console()
    stats = folder.history.checkpoint(n)
    if stats is not None:
        print_stats(console, stats, folder.history)
    else:
        console.print(f"checkpoint {n}: no statistics (written by an older version of cutline)")
    location = folder.location(n)
    if location is None and n in folder.lost:
        reason = folder.storage.missing_metadata_reason(n)
        console.print(Text(f"its state cannot be read: {reason}"), soft_wrap=True)
        return
    if location is None:
        console.print(
            "its state is not on disk any more (discarded: only the newest "
            "Checkpoints.retained stay)"
        )
        return
    print_contents(console, folder.reader(n), location)


# -------------------------------------------------------------------------------- diff


@checkpoints.command()
@click.argument("directory")
@click.argument("first", metavar="A")
@click.argument("second", metavar="B")
@click.option("--operator", help="Only this keyed operator (its name or uid).")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Differences printed per operator (all are counted).",
)
@click.option("--json", "as_json", is_flag=True, help="Print every difference as JSON lines.")
def diff(
    directory: str, first: str, second: str, operator: str | None, limit: int, as_json: bool
) -> None:
    """The keyed state that differs between checkpoints A and B of DIRECTORY, key by key:
    keys added, removed, and values changed (per operator and state)."""
    folder = Directory(directory)
    a, b = folder.checkpoint_id(first), folder.checkpoint_id(second)
    old, new = folder.reader(a), folder.reader(b)
    try:
        uids = _keyed_operators(old, new, operator)
        console = make_console()
        for uid, name in uids:
            before = _entries(old, uid)
            after = _entries(new, uid)
            changes = _changes(before, after)
            if as_json:
                for change, (state, key), value_a, value_b in changes:
                    click.echo(
                        json.dumps(
                            {
                                "operator": name,
                                "state": state,
                                "key": repr(key),
                                "change": change,
                                "a": None if change == "added" else repr(value_a),
                                "b": None if change == "removed" else repr(value_b),
                            }
                        )
                    )
                continue
            counts = {
                kind: sum(1 for c in changes if c[0] == kind)
                for kind in ("added", "removed", "changed")
            }
            console.print(
                f"[bold]{name}[/bold] ({uid}): checkpoint {a} → {b}: {counts['changed']} changed, "
                f"{counts['added']} added, {counts['removed']} removed "
                f"({len(after)} entries in {b}, {len(before)} in {a})"
            )
            for change, (state, key), value_a, value_b in changes[:limit]:
                if change == "added":
                    console.print(f"  + {state}[{key!r}] = {value_b!r}", style="green")
                elif change == "removed":
                    console.print(f"  - {state}[{key!r}] = {value_a!r}", style="red")
                else:
                    console.print(f"  ~ {state}[{key!r}]: {value_a!r} → {value_b!r}")
            if len(changes) > limit:
                console.print(f"  ... and {len(changes) - limit} more (--limit)")
    except (CorruptCheckpointError, InspectError) as exc:
        _fail(str(exc))


def _keyed_operators(
    old: CheckpointReader, new: CheckpointReader, operator: str | None
) -> list[tuple[str, str]]:
    """(uid, name) of the keyed operators to compare: ``operator``'s, or those of either."""
    if operator is not None:
        for reader in (new, old):
            try:
                uid = reader.resolve_operator(operator)
                return [(uid, reader.operator_names().get(uid, uid))]
            except InspectError:
                continue
        new.resolve_operator(operator)  # raises, naming the keyed operators
    found: dict[str, str] = {}
    for reader in (old, new):
        for op in reader.operators():
            if op.kind == "keyed":
                found.setdefault(op.uid, op.name)
    if not found:
        raise InspectError(
            f"neither checkpoint {old.checkpoint_id} nor {new.checkpoint_id} holds keyed state"
        )
    return list(found.items())


def _entries(reader: CheckpointReader, uid: str) -> dict[tuple[str, Hashable], Any]:
    if not any(uid in h.operators for h in reader.handles.values()):
        return {}
    return {(e.state, e.key): e.value for e in reader.keyed_entries(uid)}


def _changes(
    before: dict[tuple[str, Hashable], Any], after: dict[tuple[str, Hashable], Any]
) -> list[tuple[str, tuple[str, Hashable], Any, Any]]:
    changes = []
    for entry, value in after.items():
        if entry not in before:
            changes.append(("added", entry, None, value))
        elif not _same(before[entry], value):
            changes.append(("changed", entry, before[entry], value))
    for entry, value in before.items():
        if entry not in after:
            changes.append(("removed", entry, value, None))
    changes.sort(key=lambda c: (c[1][0], repr(c[1][1])))
    return changes


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. numpy arrays: compare what they look like
        return repr(a) == repr(b)


# ------------------------------------------------------------------------------ verify


@checkpoints.command()
@click.argument("directory")
@click.argument("checkpoint_id", metavar="[ID]", required=False)
def verify(directory: str, checkpoint_id: str | None) -> None:
    """Verify checkpoint ID of DIRECTORY (default: every complete checkpoint in it, and its
    savepoints still on disk): every file intact (size and SHA-256), the channel state as
    acknowledged, and for every channel: records sent before the barrier = records received
    before the snapshot + records recorded in flight. A checkpoint folder whose _metadata is
    missing though its statistics say it completed fails too. DIRECTORY may also be one
    checkpoint or savepoint folder. Exit status 1 if one is not right."""
    from cutline.runtime.checkpoint.verify import Verification, verify_checkpoint

    try:
        single = CheckpointLocation.open(directory)
        is_folder = single.fs.exists(f"{single.folder}/{METADATA}")
    except StorageError as exc:
        _fail(str(exc))
    if is_folder:
        if checkpoint_id is not None:
            _fail(f"{directory} is one checkpoint or savepoint folder: give no ID")
        targets: list[tuple[int | None, CheckpointLocation | Verification]] = [(None, single)]
    else:
        folder = Directory(directory)

        def lost(n: int) -> Verification:
            """The verdict on checkpoint ``n``, whose metadata is lost: nothing to read."""
            where = folder.storage.url_of(folder.storage.checkpoint_path(n))
            return Verification(n, where, problems=[folder.storage.missing_metadata_reason(n)])

        if checkpoint_id is not None:
            n = folder.checkpoint_id(checkpoint_id)
            location = folder.location(n)
            if location is None and n in folder.lost:
                targets = [(n, lost(n))]
            elif location is None:
                if n in folder.ids:
                    _fail(f"checkpoint {n} is incomplete (no {METADATA}): it was never completed")
                folder.reader(n)  # fails, saying it was discarded
                raise AssertionError("unreachable")
            else:
                targets = [(n, location)]
        else:
            ids = sorted(
                set(folder.completed())
                | set(folder.lost)
                | {s.checkpoint_id for s in folder.history.checkpoints if s.savepoint}
            )
            targets = []
            for n in ids:
                location = folder.location(n)
                if location is not None:
                    targets.append((n, location))
                elif n in folder.lost:
                    targets.append((n, lost(n)))
            if not targets:
                _fail(f"{directory} has no complete checkpoint to verify")
    failed = 0
    for target_id, target in targets:
        if isinstance(target, Verification):
            result = target
        else:
            try:
                result = verify_checkpoint(target, target_id)
            except StorageError as exc:
                _fail(str(exc))
        click.echo(result.summary())
        if not result.ok:
            failed += 1
            found = [*result.problems, *(str(v) for v in result.violations)]
            for problem in found[1:20]:
                click.echo(f"  {problem}")
            if len(found) > 20:
                click.echo(f"  ... and {len(found) - 20} more")
    if failed:
        click.echo(f"{failed} of {len(targets)} checkpoints failed verification", err=True)
        sys.exit(EXIT_UNVERIFIED)


# ------------------------------------------------------------------------------ report


@click.command()
@click.argument("directory")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="The HTML file to write.",
)
@click.option(
    "--checkpoint",
    "checkpoint_id",
    type=click.IntRange(min=0),
    help="The checkpoint whose barriers the space-time diagram shows (default: the slowest).",
)
def report(directory: str, output: Path, checkpoint_id: int | None) -> None:
    """Write one self-contained HTML page about the checkpoints of DIRECTORY: duration, size
    and alignment over time, the critical path of each checkpoint, the restarts, and a
    space-time diagram of one checkpoint's barriers."""
    from cutline.report import ReportError, write_report

    try:
        path = write_report(directory, output, checkpoint=checkpoint_id)
    except ReportError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write the report to {output}: {exc.strerror or exc}")
    click.echo(str(path))
