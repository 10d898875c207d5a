"""Live figures of a running job: records in and out per operator, throughput, backpressure.

Every slot's heartbeat (four a second) carries, per subtask, the records each of its chain's
operators took in and gave out, and the seconds the subtask spent unable to send (an output
channel without room: its downstream is slower). :class:`MetricsCollector` in the driver
turns them into :class:`JobMetrics`: totals of the current generation, rates over the last
few seconds, and the share of that time each operator was **backpressured** (Flink's
``backPressuredTimeMsPerSecond``: above 50% it is *high*, above 10% *low*).

The figures count records of the current generation: after a restart they start again from
the restored checkpoint (records replayed count again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    RecordCounts,
    RestartInfo,
    summed_figures,
)
from cutline.runtime.graph import ExecutionPlan, subtask_name

WINDOW = 3.0
"""Seconds over which rates and backpressure are measured."""
HIGH, LOW = 0.5, 0.1
"""Backpressure levels (share of the time unable to send)."""


@dataclass(frozen=True)
class OperatorMetrics:
    """One operator, summed over its subtasks."""

    uid: str
    name: str
    records_in: int
    records_out: int
    rate_in: float
    """Records per second taken in, over the last ``WINDOW`` (3) seconds."""
    rate_out: float
    backpressured: float
    """Share (0..1) of the last seconds its subtasks spent unable to send (the chain's:
    operators chained together share it)."""
    watermark: int | None = None
    """The event time its subtasks have all reached (epoch ms; the least of theirs), or
    ``None`` (no event time, or not every subtask has a watermark yet)."""
    late: int = 0
    """Records too late for its windows since the job started (carried across restarts and
    resumed runs), sent to ``.late()``."""
    windows: int = 0
    """Windows open (not fired yet)."""
    timers: int = 0
    """Timers registered."""
    kept: int = 0
    """(A join) rows kept now, both sides: a regular join without ``ttl`` keeps every row,
    so this grows with its input."""

    def watermark_lag(self, now: float) -> float | None:
        """Seconds the watermark is behind the wall clock ``now`` (epoch seconds); ``None``
        without one, 0 once the input ended (every timestamp passed)."""
        if self.watermark is None:
            return None
        if self.watermark >= MAX_WATERMARK:
            return 0.0
        return max(0.0, now - self.watermark / 1000)

    @property
    def backpressure(self) -> str:
        """``high``, ``low`` or ``ok``."""
        return "high" if self.backpressured > HIGH else "low" if self.backpressured > LOW else "ok"


@dataclass(frozen=True)
class JobMetrics:
    """The job's figures at one moment (``JobResult.metrics``: at its end)."""

    elapsed: float
    """Seconds since the job started."""
    generation: int
    operators: list[OperatorMetrics] = field(default_factory=list)
    """In the order of the job graph (sources first)."""
    checkpoints: list[CheckpointStats] = field(default_factory=list)
    """The last few checkpoints that ended (completed or aborted), newest last."""
    restarts: list[RestartInfo] = field(default_factory=list)
    waiting: str | None = None
    """A checkpoint in flight longer than its interval: what it waits for, and the records its
    barrier waits behind (``None``: none is)."""
    at: float = 0.0
    """When the figures were taken (epoch seconds): watermark lags are behind it."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Per source (its name) that skipped any, the records it will never read (a position
    its input no longer held, read on from elsewhere as the user's policy said), this run."""

    @property
    def late(self) -> dict[str, int]:
        """Per window operator (its name) with any, the records too late for its windows
        since the job started. Not summed: a record late for two windows is late in each."""
        return {o.name: o.late for o in self.operators if o.late}

    @property
    def event_time(self) -> bool:
        """Whether any operator has event time (a watermark, windows or timers)."""
        return any(
            o.watermark is not None or o.late or o.windows or o.timers for o in self.operators
        )

    @property
    def backpressured(self) -> list[str]:
        """Names of the operators whose backpressure is high."""
        return [o.name for o in self.operators if o.backpressure == "high"]

    def operator(self, name: str) -> OperatorMetrics:
        """The figures of operator ``name`` (its name or uid)."""
        for found in self.operators:
            if name in (found.name, found.uid):
                return found
        raise KeyError(f"no operator {name!r} (operators: {[o.name for o in self.operators]})")


class MetricsCollector:
    """Keeps the latest heartbeat figures of every subtask and computes :class:`JobMetrics`."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.generation = 0
        self._subtasks: dict[str, dict[str, Any]] = {}
        self._samples: deque[tuple[float, dict[str, tuple[int, int]], dict[str, float]]] = deque()
        self.checkpoints: deque[CheckpointStats] = deque(maxlen=5)
        self.restarts: list[RestartInfo] = []
        self.waiting: str | None = None
        """Said by the driver: see :attr:`JobMetrics.waiting`."""
        self.skips: dict[tuple[str, str, str], int] = {}
        """(source, split, why) -> the records skipped, this run (each skip once)."""
        self._chain_of = {op.uid: chain.uid for chain in plan.chains for op in chain.operators}

    def new_generation(self, generation: int) -> None:
        self.generation = generation
        self._subtasks.clear()
        self._samples.clear()

    def heartbeat(self, figures: Mapping[str, Any], now: float) -> None:
        """The figures of a slot's heartbeat: subtask -> ``ops`` (uid -> [in, out]) and
        ``backpressured`` (seconds)."""
        for subtask, values in figures.items():
            if isinstance(values, Mapping):
                self._subtasks[str(subtask)] = dict(values)
        totals = self._totals()
        pressure = self._pressure()
        self._samples.append((now, totals, pressure))
        while len(self._samples) > 2 and now - self._samples[1][0] >= WINDOW:
            self._samples.popleft()

    def _totals(self) -> dict[str, tuple[int, int]]:
        totals: dict[str, tuple[int, int]] = {}
        for values in self._subtasks.values():
            for uid, counted in dict(values.get("ops", {})).items():
                taken, given = totals.get(uid, (0, 0))
                totals[uid] = (taken + int(counted[0]), given + int(counted[1]))
        return totals

    def counted(self) -> RecordCounts:
        """What this generation's subtasks counted, as they last said (once every slot
        finished: all they counted): records in and out per operator, and dead letters."""
        dead_letters = sum(int(v.get("dead_letters", 0)) for v in self._subtasks.values())
        return RecordCounts(self._totals(), dead_letters)

    def _pressure(self) -> dict[str, float]:
        """Chain uid -> seconds its subtasks were unable to send, summed."""
        pressure: dict[str, float] = {}
        for chain in self.plan.chains:
            pressure[chain.uid] = sum(
                float(self._subtasks.get(subtask_name(chain.uid, i), {}).get("backpressured", 0))
                for i in range(self.plan.parallelism)
            )
        return pressure

    def snapshot(self, elapsed: float) -> JobMetrics:
        """The figures now."""
        totals = self._totals()
        first = self._samples[0] if self._samples else None
        last = self._samples[-1] if self._samples else None
        span = (last[0] - first[0]) if first is not None and last is not None else 0.0
        event_time = summed_figures(
            dict(values.get("event_time", {})) for values in self._subtasks.values()
        )
        operators = []
        for chain in self.plan.chains:
            for op in chain.operators:
                taken, given = totals.get(op.uid, (0, 0))
                rate_in = rate_out = pressure = 0.0
                if first is not None and last is not None and span > 0:
                    then_in, then_out = first[1].get(op.uid, (0, 0))
                    now_in, now_out = last[1].get(op.uid, (0, 0))
                    rate_in = max(0.0, (now_in - then_in) / span)
                    rate_out = max(0.0, (now_out - then_out) / span)
                    chain_uid = self._chain_of[op.uid]
                    blocked = last[2].get(chain_uid, 0.0) - first[2].get(chain_uid, 0.0)
                    pressure = min(1.0, max(0.0, blocked / (span * self.plan.parallelism)))
                figures = event_time.get(op.uid, {})
                operators.append(
                    OperatorMetrics(
                        op.uid,
                        op.name,
                        taken,
                        given,
                        rate_in,
                        rate_out,
                        pressure,
                        watermark=self._watermark(chain.uid),
                        late=figures.get("late", 0),
                        windows=figures.get("windows", 0),
                        timers=figures.get("timers", 0),
                        kept=figures.get("kept", 0),
                    )
                )
        return JobMetrics(
            elapsed=elapsed,
            generation=self.generation,
            operators=operators,
            checkpoints=list(self.checkpoints),
            restarts=list(self.restarts),
            waiting=self.waiting,
            at=time.time(),
            skipped=self.skipped(),
        )

    def skip(self, source: str, split: str, records: int, why: str) -> bool:
        """A source skipped ``records`` of ``split``; whether that skip is new (a restore that
        repeats one says the same ``why``)."""
        key = (source, split, why)
        if key in self.skips:
            return False
        self.skips[key] = records
        return True

    def skipped(self) -> dict[str, int]:
        """Per source (its name), the records it skipped this run."""
        totals: dict[str, int] = {}
        for (source, _, _), records in self.skips.items():
            totals[source] = totals.get(source, 0) + records
        return totals

    def _watermark(self, chain_uid: str) -> int | None:
        """The least watermark of the chain's subtasks (``None`` if one has none yet)."""
        found = []
        for i in range(self.plan.parallelism):
            values = self._subtasks.get(subtask_name(chain_uid, i))
            watermark = values.get("watermark") if values is not None else None
            if watermark is None:
                return None
            found.append(int(watermark))
        return min(found) if found else None
