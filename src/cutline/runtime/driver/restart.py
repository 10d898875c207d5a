"""When a failed job starts again: restart strategies (Flink's four) and the rule that a
restart cannot mend a failure that repeats at one record.

After an attempt failed, the job restarts from its latest complete checkpoint after a delay,
or fails for good, as its strategy says:

* :class:`ExponentialDelay` (the default, as in Flink): the first restart after ``initial``,
  each next one ``multiplier`` times later, at most ``maximum``, each delay moved at random by
  up to ``jitter`` of itself (so that many jobs hit by one outage do not come back at once);
  after ``reset_after`` without a failure the delay is ``initial`` again and the restarts are
  counted from zero. It gives up after ``attempts`` restarts in a row (``None``: never). The
  defaults ride out an outage of about two minutes (a database or broker restarted, a
  failover) and fail a job that cannot recover in a few.
* :class:`FixedDelay`: at most ``attempts`` restarts in a run, each ``delay`` after the
  failure.
* :class:`FailureRate`: restarts ``delay`` after each failure, and gives up when more than
  ``failures`` happened within ``interval``.
* :class:`NoRestart`: the first failure fails the job.

Whatever the strategy, a job never restarts when

* another job took its checkpoint directory over (two jobs must not write one directory);
* it failed **at the same record in the same operator, with the same error, in two attempts
  in a row**: a deterministic error (a value that does not fit a column, a line that is not
  JSON, a user function's bug), which a restart cannot help; it fails at once, saying so.
  ``on_error="dead_letter"`` on that operator keeps such records aside and the job goes on.
  An error of the kind that passes (``OSError``: a connection refused or reset, a timeout,
  I/O) never counts as deterministic: a function calling a service that is down fails at the
  first record after every restore, and should be restarted until the service is back.

:class:`Restarts` keeps one run's decisions; it reads no clock (the time is an argument) and
draws its jitter from its own seeded random numbers.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import TypeAlias, assert_never

from cutline.runtime.driver.result import Failure
from cutline.runtime.durations import Duration, said, seconds

HOST_LOSS_POLICIES = ("restart", "wait")
"""After a generation failed: ``restart`` at once on the slots there are (the hosts that remain,
when they have enough), or ``wait`` (up to ``Timeouts.slots``) for every host it ran on to be
back."""


def _duration(value: Duration, what: str) -> float:
    duration = seconds(value, what)
    if duration is None or not 0 <= duration < math.inf:
        raise ValueError(f"{what} must be a finite duration of 0 or more, not {value!r}")
    return duration


def _f(value: Duration) -> float:
    """A duration its strategy has made seconds already (in its ``__post_init__``)."""
    assert isinstance(value, float)
    return value


def _count(value: object, what: str, least: int) -> int:
    if type(value) is not int or value < least:
        raise ValueError(f"{what} must be an integer of {least} or more, not {value!r}")
    return value


@dataclass(frozen=True)
class FixedDelay:
    """At most ``attempts`` restarts in a run, each ``delay`` after the failure (Flink's
    ``fixed-delay``). ``StreamEnvironment(restart_strategy=FixedDelay(3, "1s"))``.

    :param attempts: restarts in a run before the job fails for good (0: none). Default 3.
    :param delay: time from a failure to the restart: a duration (seconds, text such as
        ``"500ms"`` or ``"1s"``, or a ``timedelta``), kept in seconds. Default 1 s.
    """

    attempts: int = 3
    delay: Duration = 1.0

    def __post_init__(self) -> None:
        _count(self.attempts, "FixedDelay: attempts", 0)
        object.__setattr__(self, "delay", _duration(self.delay, "FixedDelay: delay"))


@dataclass(frozen=True)
class ExponentialDelay:
    """Restarts ever later: ``initial`` after the first failure, then ``multiplier`` times
    the last delay, at most ``maximum``, each moved at random by up to ``jitter`` of itself
    (so that many jobs hit by one outage do not come back at once). The default strategy:
    Flink's ``exponential-delay`` and its defaults, but for ``attempts`` (Flink's restarts for
    ever); they ride out an outage of about two minutes and fail a job that cannot recover in
    a few. Durations are seconds, text (``"500ms"``, ``"1min"``) or a ``timedelta``, kept in
    seconds.

    :param initial: the delay before the first restart (and the first after a reset).
        Default 1 s.
    :param maximum: the longest delay (at least ``initial``). Default 1 min.
    :param multiplier: each delay is this many times the one before (1 or more). Default 1.5.
    :param jitter: the fraction (0 to 1) of each delay by which it is moved at random, earlier
        or later. Default 0.1.
    :param reset_after: after this long without a failure the delay is ``initial`` again and
        the restarts are counted from zero. Default 1 h.
    :param attempts: restarts in a row (since the last reset) before the job fails for good;
        ``None``: never gives up. Default 20.
    """

    initial: Duration = 1.0
    maximum: Duration = 60.0
    multiplier: float = 1.5
    jitter: float = 0.1
    reset_after: Duration = 3600.0
    attempts: int | None = 20

    def __post_init__(self) -> None:
        for name in ("initial", "maximum", "reset_after"):
            value = _duration(getattr(self, name), f"ExponentialDelay: {name}")
            object.__setattr__(self, name, value)
        if _f(self.maximum) < _f(self.initial):
            raise ValueError(
                f"ExponentialDelay: maximum ({said(_f(self.maximum))}) must be at least "
                f"initial ({said(_f(self.initial))})"
            )
        if isinstance(self.multiplier, bool) or not (
            isinstance(self.multiplier, int | float) and 1 <= self.multiplier < math.inf
        ):
            raise ValueError(
                f"ExponentialDelay: multiplier must be a number of 1 or more, not "
                f"{self.multiplier!r}"
            )
        if isinstance(self.jitter, bool) or not (
            isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1
        ):
            raise ValueError(
                f"ExponentialDelay: jitter must be a fraction from 0 to 1, not {self.jitter!r}"
            )
        if self.attempts is not None:
            _count(self.attempts, "ExponentialDelay: attempts", 0)

    def delay(self, restarts: int) -> float:
        """The delay before restart ``restarts + 1`` since the last reset, before jitter."""
        try:
            grown = _f(self.initial) * self.multiplier**restarts
        except OverflowError:
            grown = math.inf
        return min(_f(self.maximum), grown)


@dataclass(frozen=True)
class FailureRate:
    """Restarts ``delay`` after each failure, and gives up when more than ``failures``
    failures happened within ``interval`` (Flink's ``failure-rate`` and its defaults).
    Durations are seconds, text (``"500ms"``, ``"1min"``) or a ``timedelta``, kept in seconds.

    :param failures: failures tolerated within ``interval`` (1 or more); one more fails the
        job for good. Default 1.
    :param interval: the window the failures are counted in. Default 1 min.
    :param delay: time from a failure to the restart. Default 1 s.
    """

    failures: int = 1
    interval: Duration = 60.0
    delay: Duration = 1.0

    def __post_init__(self) -> None:
        _count(self.failures, "FailureRate: failures", 1)
        for name in ("interval", "delay"):
            value = _duration(getattr(self, name), f"FailureRate: {name}")
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class NoRestart:
    """The first failure fails the job (Flink's ``none``)."""


RestartStrategy: TypeAlias = ExponentialDelay | FixedDelay | FailureRate | NoRestart
"""How a job restarts after a failure (see the module's docstring)."""

RESTART_STRATEGIES = (ExponentialDelay, FixedDelay, FailureRate, NoRestart)


@dataclass(frozen=True)
class Restart:
    """Start the next attempt after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class GiveUp:
    """The job fails for good: ``why``."""

    why: str
    deterministic: bool = False
    """The failure repeated at one record: a restart cannot help."""


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def signature(failure: Failure) -> tuple[str, str, str] | None:
    """What makes ``failure`` the same as another: its operator, record and error, when a
    record is to blame and the error is not of a kind that passes; ``None`` otherwise (a
    restart may mend it). Object addresses (``0x7f...``) do not count: they differ between
    processes."""
    if failure.record is None or failure.passing or failure.cause != "task":
        return None
    return (
        failure.operator or "",
        _ADDRESS.sub("0x", failure.record),
        _ADDRESS.sub("0x", failure.message),
    )


@dataclass
class Restarts:
    """One run's restart decisions (see the module's docstring): :meth:`after` each failure,
    with the time (seconds, any clock that only goes forward)."""

    strategy: RestartStrategy = field(default_factory=ExponentialDelay)
    seed: int | None = None
    restarted: int = 0
    """Restarts so far in this run."""
    streak: int = 0
    """:class:`ExponentialDelay`: restarts since its last reset."""
    failed_at: list[float] = field(default_factory=list)
    """When each failure of this run happened."""
    last: tuple[str, str, str] | None = None
    """The signature of the last failure (``None``: not one at a record)."""

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def after(self, failure: Failure, now: float) -> Restart | GiveUp:
        """Whether, and after how long, the job restarts after ``failure`` at ``now``."""
        previous = self.failed_at[-1] if self.failed_at else None
        self.failed_at.append(now)
        same = signature(failure)
        repeated = same is not None and same == self.last
        self.last = same
        if failure.cause == "lock":
            return GiveUp("another job took its checkpoint directory over")
        if repeated:
            return GiveUp(
                "it failed at the same record in the same operator with the same error in two "
                "attempts in a row: a deterministic error, which a restart cannot help "
                "(on_error='dead_letter' on that operator keeps such records aside and the "
                "job goes on)",
                deterministic=True,
            )
        decision = self._decide(now, previous)
        if isinstance(decision, Restart):
            self.restarted += 1
        return decision

    def _decide(self, now: float, previous: float | None) -> Restart | GiveUp:
        strategy = self.strategy
        match strategy:
            case NoRestart():
                return GiveUp(f"its restart strategy is {strategy!r}")
            case FixedDelay(attempts=attempts, delay=delay):
                if self.restarted >= attempts:
                    return GiveUp(f"{strategy!r} used its {attempts} restart(s)")
                return Restart(_f(delay))
            case FailureRate(failures=failures, interval=interval, delay=delay):
                recent = [t for t in self.failed_at if now - t < _f(interval)]
                if len(recent) > failures:
                    return GiveUp(
                        f"{len(recent)} failures within {said(_f(interval))}: more than "
                        f"{strategy!r} allows"
                    )
                return Restart(_f(delay))
            case ExponentialDelay():
                if previous is not None and now - previous >= _f(strategy.reset_after):
                    self.streak = 0  # (a stable period: as if it never failed)
                if strategy.attempts is not None and self.streak >= strategy.attempts:
                    return GiveUp(f"{strategy!r} used its {strategy.attempts} restart(s) in a row")
                delay = strategy.delay(self.streak)
                delay *= 1 + strategy.jitter * (2 * self.random.random() - 1)
                self.streak += 1
                return Restart(max(0.0, delay))
            case _:
                assert_never(strategy)
