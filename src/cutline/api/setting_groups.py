"""The settings of a job in groups, given to :class:`~cutline.StreamEnvironment`:
:class:`Checkpoints` (when checkpoints are taken, where they go, how barriers are handled),
:class:`State` (where keyed state lives) and :class:`Timeouts` (how long each phase of an
attempt may take). How a job restarts after a failure is the fourth:
``restart_strategy=`` (:class:`~cutline.ExponentialDelay`, :class:`~cutline.FixedDelay`,
:class:`~cutline.FailureRate`, :class:`~cutline.NoRestart`).

::

    from cutline import Checkpoints, State, StreamEnvironment

    env = StreamEnvironment(
        4,
        checkpoints=Checkpoints(interval="10s", dir="s3://bucket/ck", retained=3),
        state=State(backend="disk", memory=256 * 2**20),
    )

Each group is a frozen value checked when it is made: a field that cannot work is a
``ValueError`` naming the field and the value (``Checkpoints.retained must be an integer of 1
or more, not 0``), raised where the group is written, never when the job runs. A group's
durations are read when it is made and kept in seconds: a number of seconds, text with a
unit (``"500ms"``, ``"1s"``, ``"2min"``, ``"1h"``) or a :class:`datetime.timedelta`
(:mod:`cutline.runtime.durations`); so ``Checkpoints(interval="1s").interval == 1.0``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeAlias, get_args

from cutline.runtime.durations import Duration, seconds

CheckpointingMode: TypeAlias = Literal["aligned", "unaligned", "at_least_once"]
"""How barriers are handled: see ``Checkpoints.mode``."""
StateBackend: TypeAlias = Literal["memory", "disk"]
"""Where keyed state lives: see ``State.backend``."""
HostLossPolicy: TypeAlias = Literal["restart", "wait"]
"""What a job does after a failure that lost a host: ``StreamEnvironment(on_host_loss=...)``."""
Place: TypeAlias = str | os.PathLike[str]
"""A local path or an fsspec URL (``s3://...``, ``hdfs://...``)."""


def location(path: Place) -> str:
    """A URL as it is; a local path made absolute, so that it names the same place in every
    process (a Spark executor's working directory is not the driver's)."""
    text = os.fspath(path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


# ------------------------------------------------------------------------------ checks
# Each takes the value as written and the name to say (``Checkpoints.timeout``, or the flat
# keyword it was given as) and returns it as the group keeps it, or raises a ValueError.

Check: TypeAlias = Callable[[Any, str], Any]


def _duration(least: float, *, optional: bool = False, above: bool = False) -> Check:
    """A finite duration, kept in seconds, of at least ``least`` (more than it: ``above``)."""
    bound = f"greater than {least:g}" if above else f"of {least:g} s or more"

    def check(value: Any, what: str) -> float | None:
        if value is None and optional:
            return None
        duration = seconds(value, what)
        if duration is None or not math.isfinite(duration) or duration < least:
            raise ValueError(f"{what} must be a finite duration {bound}, not {value!r}")
        if above and duration == least:
            raise ValueError(f"{what} must be a finite duration {bound}, not {value!r}")
        return duration

    return check


def _count(least: int) -> Check:
    def check(value: Any, what: str) -> int:
        if type(value) is not int or value < least:  # (True is no count)
            raise ValueError(f"{what} must be an integer of {least} or more, not {value!r}")
        return value

    return check


def _choice(options: Any) -> Check:
    """One of the strings of the ``Literal`` ``options``."""
    allowed: tuple[str, ...] = get_args(options)

    def check(value: Any, what: str) -> str:
        if not isinstance(value, str) or value not in allowed:
            said = ", ".join(map(repr, allowed))
            raise ValueError(f"{what} must be one of {said}, not {value!r}")
        return value

    return check


def _flag(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{what} must be True or False, not {value!r}")
    return value


def _place(value: Any, what: str) -> str | None:
    """A place every process reads alike (see :func:`location`), or ``None``."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(f"{what} must be a path or a URL, not {value!r}")
    return location(value)


def _local_dir(value: Any, what: str) -> str | None:
    """A directory on each worker, as written (each worker reads it on its own host)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(f"{what} must be a path, not {value!r}")
    return os.fspath(value)


def _bytes(least: int) -> Check:
    def check(value: Any, what: str) -> int:
        if type(value) is not int or value < least:
            raise ValueError(
                f"{what} must be a number of bytes of at least {least} ({least // 2**20} MiB), "
                f"not {value!r}"
            )
        return value

    return check


class _Group:
    """What the three groups share: each field checked (and durations read) when made."""

    CHECKS: ClassVar[dict[str, Check]]
    """Field -> its check (see the checks above)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field, check in self.CHECKS.items():
            value = check(getattr(self, field), f"{name}.{field}")
            object.__setattr__(self, field, value)
        self._check_together()

    def _check_together(self) -> None:
        """Checks of fields that depend on one another (after each one's own)."""

    @classmethod
    def check_field(cls, field: str, value: Any, what: str) -> Any:
        """``value`` as field ``field`` keeps it, or a ``ValueError`` naming ``what``."""
        return cls.CHECKS[field](value, what)

    def given(self) -> dict[str, Any]:
        """The fields set to other than their defaults."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclass(frozen=True)
class Checkpoints(_Group):
    """When a job takes checkpoints, where it keeps them, and how its subtasks handle a
    checkpoint's barriers. The names are those of Flink's ``CheckpointConfig``.

    :param interval: time from one checkpoint's trigger to the next (a duration, kept in
        seconds; greater than 0). ``None``: no periodic checkpoints, only the final one at the
        end of bounded input (and savepoints on request). Default ``"1s"``. Also
        ``StreamEnvironment(checkpoint_interval=...)``.
    :param dir: where checkpoints go: a local path (made absolute) or any fsspec URL
        (``s3://...``, ``hdfs://...``); on a cluster, a place every host can read and write.
        Default ``None``: a temporary directory, removed after the job (so nothing to resume).
        Also ``StreamEnvironment(checkpoint_dir=...)``.
    :param timeout: a checkpoint not complete this long after its trigger is aborted (and
        counts as a failed checkpoint). Default ``"10min"``.
    :param min_pause: the least time from the end of one checkpoint (complete or aborted) to
        the next trigger, so that a job whose checkpoints take longer than ``interval`` still
        gets on with its records. Default ``0``.
    :param tolerable_failures: checkpoints that may fail in a row (timed out, declined by a
        subtask, a storage error) before the job fails and restarts. Default ``0``.
    :param retained: complete checkpoints kept in ``dir``, across the runs that resume one
        another; an older one is deleted once a newer one completes, never one a restart may
        still need, nor one of a run this one did not resume. Default ``1``.
    :param max_concurrent: periodic checkpoints in flight at once; a newer complete one
        subsumes older pending ones. Must be 1 with ``mode="unaligned"`` and with an
        ``alignment_timeout`` (as in Flink). Default ``1``.
    :param mode: how barriers are handled; every mode restarts from the latest complete
        checkpoint after a failure. ``"aligned"`` (the default; exactly once): a subtask waits
        for a checkpoint's barrier on every input before it snapshots, so checkpoints hold no
        records. ``"unaligned"`` (exactly once): a subtask snapshots on the first barrier,
        which overtakes the records queued in the buffers; those are stored with the
        checkpoint (its channel state) and replayed first after a restore, so checkpoints
        complete quickly under backpressure. ``"at_least_once"``: inputs never wait; a restore
        may publish records twice (never lose them). The final checkpoint at the end of
        bounded input is always aligned.
    :param alignment_timeout: with ``mode="aligned"``: a checkpoint not aligned at a subtask
        this long after its trigger (or whose barrier still waits in an output queue) goes
        unaligned there: small checkpoints while records flow, bounded duration when they do
        not. A duration of 0 or more; default ``None``: never.
    :param savepoint_dir: where savepoints go when the request names no directory (a local
        path or an fsspec URL). Default ``None``: ``dir/savepoints``.
    """

    interval: Duration | None = "1s"
    dir: Place | None = None
    timeout: Duration = "10min"
    min_pause: Duration = 0
    tolerable_failures: int = 0
    retained: int = 1
    max_concurrent: int = 1
    mode: CheckpointingMode = "aligned"
    alignment_timeout: Duration | None = None
    savepoint_dir: Place | None = None

    CHECKS: ClassVar[dict[str, Check]] = {
        "interval": _duration(0, optional=True, above=True),
        "dir": _place,
        "timeout": _duration(0, above=True),
        "min_pause": _duration(0),
        "tolerable_failures": _count(0),
        "retained": _count(1),
        "max_concurrent": _count(1),
        "mode": _choice(CheckpointingMode),
        "alignment_timeout": _duration(0, optional=True),
        "savepoint_dir": _place,
    }

    def _check_together(self) -> None:
        if self.alignment_timeout is not None and self.mode != "aligned":
            raise ValueError(
                "Checkpoints.alignment_timeout applies to mode='aligned' only, not "
                f"mode={self.mode!r}"
            )
        if self.max_concurrent > 1 and self.mode == "unaligned":
            raise ValueError(
                "unaligned checkpoints are taken one at a time: Checkpoints.max_concurrent "
                f"must be 1 with mode='unaligned', not {self.max_concurrent!r}"
            )
        if self.max_concurrent > 1 and self.alignment_timeout is not None:
            raise ValueError(
                "with an alignment_timeout checkpoints may go unaligned, and those are taken "
                "one at a time: Checkpoints.max_concurrent must be 1, not "
                f"{self.max_concurrent!r}"
            )


@dataclass(frozen=True)
class State(_Group):
    """Where a job keeps its keyed state (running aggregations, windows, ``process()``
    functions' value, list and map state) and how it checkpoints it.

    :param backend: ``"memory"`` (the default): Python dicts in each worker, fastest, for
        state that fits in memory. ``"disk"``: an embedded RocksDB on each worker's disk, for
        state larger than memory.
    :param incremental: a checkpoint writes only the keyed state that changed since the last
        complete one (plus a full one every ``full_every``). Default ``True``.
    :param full_every: with ``incremental``: at most this many checkpoints in a chain (one
        full, the rest incremental) before the next full one, so that a restore never reads
        an endless chain and old files can be deleted. Default ``10``.
    :param dir: with ``"disk"``: where each worker keeps its working databases, a path on the
        worker's own host. They are scratch space, removed when the subtask ends (a killed
        worker's at the next start): checkpoints are what survives. Default ``None``: the
        system's temporary directory.
    :param memory: with ``"disk"``: bytes of memory per keyed operator subtask for RocksDB's
        write buffers and block cache and for the changes not yet written to it; a window
        operator writes its runs, and a join its rows, to files beyond half of it. At least
        1 MiB; default ``64 * 2**20`` (64 MiB).
    """

    backend: StateBackend = "memory"
    incremental: bool = True
    full_every: int = 10
    dir: Place | None = None
    memory: int = 64 * 2**20

    CHECKS: ClassVar[dict[str, Check]] = {
        "backend": _choice(StateBackend),
        "incremental": _flag,
        "full_every": _count(1),
        "dir": _local_dir,
        "memory": _bytes(2**20),
    }


@dataclass(frozen=True)
class Timeouts(_Group):
    """How long each phase of an attempt (a start or a restart of the job) may take, and a
    task slot may stay silent, before the attempt fails naming the slot and the job restarts
    (as its restart strategy says). Each is a duration, kept in seconds.

    :param heartbeat: a slot silent this long (in any phase: heartbeats go from the moment it
        reached the driver) is declared lost; a killed one is noticed at once, a host cut off
        from the network after this long. Default ``"30s"``.
    :param start: each slot of an attempt must be running and have reached the driver this
        long after the launch, and the slots' rendezvous must end this long after the last
        one arrived. Default ``"1min"``.
    :param restore: each slot must have restored its state, opened its operators and
        connected its outputs this long after it began (a large state takes longer). Default
        ``"10min"``.
    :param commit: after the final checkpoint completed, every slot must have published its
        output and ended this long after. Default ``"2min"``.
    :param slots: how long each start and restart waits for its task slots (one per subtask
        index, all at once: on a cluster executors register after the session starts, and
        come back after a lost host); then the attempt fails. With
        ``StreamEnvironment(on_host_loss="wait")`` also how long a restart waits for the hosts
        the failed attempt ran on. 0 or more; default ``"2min"``.
    """

    heartbeat: Duration = "30s"
    start: Duration = "1min"
    restore: Duration = "10min"
    commit: Duration = "2min"
    slots: Duration = "2min"

    CHECKS: ClassVar[dict[str, Check]] = {
        "heartbeat": _duration(0, above=True),
        "start": _duration(0, above=True),
        "restore": _duration(0, above=True),
        "commit": _duration(0, above=True),
        "slots": _duration(0),
    }


GROUPS: dict[str, type[Checkpoints] | type[State] | type[Timeouts]] = {
    "checkpoints": Checkpoints,
    "state": State,
    "timeouts": Timeouts,
}
"""``StreamEnvironment``'s keyword -> the group it takes."""
