"""What a job did, from its start to its end: the figures ``print(result)`` ends with, and
``JobResult.summary()``.

The records each operator took in and gave out are counted since the job started, across
restarts and the runs that resume one another, each record once however often it was read
again after a restore (:class:`~cutline.runtime.checkpoint.stats.RecordCounts`): a source's
records out are the records it read, a sink's records in those it wrote, a window
operator's records out its results (one per key and window for the built-in aggregations).
Late records are the window operators' own count, also kept in their state since the job
started. Checkpoints and restarts are this run's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.checkpoint.stats import RecordCounts, RestartInfo
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.graph import ExecutionPlan, Operator
from cutline.runtime.sink_operator import SinkLogic

CAUSE_MOST = 100
"""Characters of a restart's cause the verdict shows (its first line)."""


@dataclass(frozen=True)
class OperatorCount:
    """One operator's records since the job started."""

    uid: str
    name: str
    kind: str
    """``source``, ``sink``, ``window`` or ``operator``."""
    records_in: int
    records_out: int


@dataclass(frozen=True)
class JobCounts:
    """Every operator's records and the dead letters since the job started, at its end."""

    operators: tuple[OperatorCount, ...]
    """In the order of the job graph (sources first)."""
    dead_letters: int = 0
    since: str | None = None
    """``None``: counted since the job started. Else where the counting began: a checkpoint
    or savepoint restored that does not say what was counted before it (written by an older
    version of cutline)."""

    @classmethod
    def of(cls, plan: ExecutionPlan, counts: RecordCounts, since: str | None) -> JobCounts:
        """The counts of the job's operators (the plan's, by uid) in ``counts``."""
        operators = []
        for chain in plan.chains:
            for op in chain.operators:
                taken, given = counts.operators.get(op.uid, (0, 0))
                operators.append(OperatorCount(op.uid, op.name, kind_of(op), taken, given))
        return cls(tuple(operators), counts.dead_letters, since)


def kind_of(op: Operator) -> str:
    """What the verdict counts of operator ``op``: a source's records out (read), a sink's
    records in (written), a window operator's records out (its results)."""
    if op.is_source:
        return "source"
    if isinstance(op.logic, SinkLogic):
        return "sink"
    if isinstance(op.logic, WindowLogic):
        return "window"
    return "operator"


@dataclass(frozen=True)
class JobSummary:
    """The job's figures from its start to its end (``JobResult.summary()``); its
    :meth:`verdict` is how ``print(result)`` ends."""

    read: dict[str, int] = field(default_factory=dict)
    """Per source (its name), the records it read."""
    written: dict[str, int] = field(default_factory=dict)
    """Per sink (its name), the records it wrote (published once each by an exactly-once
    sink; a record the sink failed to write and sent to the dead letters counts too)."""
    window_results: dict[str, int] = field(default_factory=dict)
    """Per window operator (its name), the results it emitted: the windows fired, one per key
    and window, for the built-in aggregations (``.process(fn)`` emits what ``fn`` yields)."""
    late: dict[str, int] = field(default_factory=dict)
    """Per window operator, the records too late for its windows (sent to ``.late()``)."""
    dead_letters: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Per source that skipped any, the records it will never read (a position its input no
    longer held, read on from elsewhere as the user's policy said), this run."""
    watermark: int | None = None
    """The least watermark of the job's operators at the end (epoch ms;
    :data:`~cutline.protocol.watermarks.MAX_WATERMARK`: the input ended), ``None`` without
    event time."""
    checkpoints: int = 0
    """Checkpoints this run completed (savepoints apart)."""
    savepoints: int = 0
    restarts: tuple[str, ...] = ()
    """Each restart of this run: the generation that failed and the first line of why."""
    records: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per operator (its name; with its id when two share a name), records in and out."""
    windows: bool = False
    """Whether the job has window operators (the verdict then says their late records)."""
    since: str | None = None
    """See :attr:`JobCounts.since`."""
    counted: bool = True
    """Whether the records were counted (a result made by hand has no counts)."""

    @classmethod
    def of(
        cls,
        counts: JobCounts | None,
        late: Mapping[str, int],
        watermarks: list[int],
        checkpoints: int,
        savepoints: int,
        restarts: list[RestartInfo],
        skipped: Mapping[str, int] | None = None,
    ) -> JobSummary:
        """The summary of a job's counts, its late records and watermarks at the end (of its
        operators that have one), its checkpoints and restarts."""
        operators = counts.operators if counts is not None else ()
        names = [op.name for op in operators]
        label = {op.uid: op.name if names.count(op.name) == 1 else op.uid for op in operators}
        return cls(
            read={label[o.uid]: o.records_out for o in operators if o.kind == "source"},
            written={label[o.uid]: o.records_in for o in operators if o.kind == "sink"},
            window_results={label[o.uid]: o.records_out for o in operators if o.kind == "window"},
            late=dict(late),
            dead_letters=counts.dead_letters if counts is not None else 0,
            skipped=dict(skipped or {}),
            watermark=min(watermarks) if watermarks else None,
            checkpoints=checkpoints,
            savepoints=savepoints,
            restarts=tuple(
                f"generation {r.generation}: {_first_line(r.cause)}"
                + (f" (restarted after {r.delay:.1f} s)" if r.delay else "")
                for r in restarts
                if r.restarted
            ),
            records={label[o.uid]: (o.records_in, o.records_out) for o in operators},
            windows=any(o.kind == "window" for o in operators),
            since=counts.since if counts is not None else None,
            counted=counts is not None,
        )

    def verdict(self) -> str:
        """The figures in a sentence: ``read 20,000 records (clicks 20,000); wrote 1,200
        (per_minute_out 1,200); 1,200 window results (per_minute 1,200); 11 late records
        (per_minute 11); no dead letters; watermark at the end: end of input; no
        restarts``."""
        parts = []
        if self.counted:
            total = sum(self.read.values())
            parts.append(f"read {_records(total)} ({_each(self.read)})")
            if self.written:
                parts.append(f"wrote {sum(self.written.values()):,} ({_each(self.written)})")
            if self.window_results:
                results = sum(self.window_results.values())
                parts.append(
                    f"{results:,} window result{_s(results)} ({_each(self.window_results)})"
                )
        late = sum(self.late.values())
        if late:
            parts.append(f"{_records(late, 'late record')} ({_each(self.late)})")
        elif self.windows:
            parts.append("no late records")
        if self.counted:
            dead = self.dead_letters
            parts.append(f"{dead:,} dead letter{_s(dead)}" if dead else "no dead letters")
        if self.skipped:
            skipped = sum(self.skipped.values())
            parts.append(f"{_records(skipped)} skipped ({_each(self.skipped)})")
        if self.watermark is not None:
            parts.append(f"watermark at the end: {watermark_text(self.watermark)}")
        if self.restarts:
            count = len(self.restarts)
            parts.append(f"{count} restart{_s(count)} ({'; '.join(self.restarts)})")
        else:
            parts.append("no restarts")
        text = "; ".join(parts)
        if self.since is not None:
            text = f"since the restore of {self.since}: {text}"
        return text


def watermark_text(watermark: int) -> str:
    """A watermark for people: its UTC date and time, or ``end of input``."""
    if watermark >= MAX_WATERMARK:
        return "end of input"
    seconds, ms = divmod(watermark, 1000)
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{ms:03d} UTC"
    except (OverflowError, OSError, ValueError):  # (not a time of this era)
        return f"{watermark:,} ms"


def _first_line(cause: str) -> str:
    line = cause.splitlines()[0] if cause else "?"
    return line if len(line) <= CAUSE_MOST else line[: CAUSE_MOST - 3] + "..."


def _records(count: int, what: str = "record") -> str:
    return f"{count:,} {what}{_s(count)}"


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _each(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count:,}" for name, count in counts.items())
