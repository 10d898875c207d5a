"""Restart strategies (Flink's four) and the rule that a restart cannot mend a failure that
repeats at one record: the decisions alone over random failures (``Restarts``, a clock given),
then whole jobs (slots as threads) whose failures are made by construction, a flag file or a
count of the attempts, never a time.
"""

from __future__ import annotations

import datetime as dt
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_jobs import dead_letters

from cutline import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    JobEvent,
    JobFailedError,
    JobListener,
    NoRestart,
    Restarting,
    StreamEnvironment,
    testing,
)
from cutline.runtime.driver.restart import GiveUp, Restart, Restarts, signature
from cutline.runtime.driver.result import Failure
from cutline.runtime.task.local import ThreadLauncher

from ledger import first_time

pytestmark = pytest.mark.jobs


def failure(n: int = 0, *, record: str | None = None, passing: bool = False) -> Failure:
    return Failure("task", f"ValueError: bad {n}", "s-0", "map(f)", record, None, passing)


# ------------------------------------------------------------------- the decisions alone


@given(
    gaps=st.lists(st.floats(0, 5000), min_size=1, max_size=60),
    initial=st.floats(0.01, 10),
    multiplier=st.floats(1, 3),
    jitter=st.floats(0, 1),
    attempts=st.none() | st.integers(0, 30),
)
def test_exponential_delay_grows_to_its_maximum_resets_and_gives_up(
    gaps: list[float], initial: float, multiplier: float, jitter: float, attempts: int | None
) -> None:
    strategy = ExponentialDelay(initial, 60.0, multiplier, jitter, 600.0, attempts)
    restarts = Restarts(strategy, seed=1)
    now, streak = 0.0, 0
    for n, gap in enumerate(gaps):
        if n and gap >= 600:
            streak = 0  # (a stable period since the last failure: counted from zero again)
        now += gap
        decision = restarts.after(failure(), now)
        if attempts is not None and streak >= attempts:
            assert isinstance(decision, GiveUp), decision
            assert f"used its {attempts} restart(s) in a row" in decision.why
            return
        assert isinstance(decision, Restart)
        planned = min(60.0, initial * multiplier**streak)
        assert planned * (1 - jitter) - 1e-9 <= decision.delay <= planned * (1 + jitter) + 1e-9
        streak += 1


def test_the_default_rides_out_an_outage_of_a_minute() -> None:
    """The default strategy, every attempt failing at once (the worst case: no time spent
    running), still waits more than two minutes in all before it gives up, whatever its
    jitter draws."""
    for seed in range(50):
        restarts, now, waited = Restarts(ExponentialDelay(), seed=seed), 0.0, 0.0
        while isinstance(decision := restarts.after(failure(), now), Restart):
            waited += decision.delay
            now += decision.delay
        assert waited > 120, (seed, waited)
        assert restarts.restarted == 20


@given(gaps=st.lists(st.floats(0, 100), min_size=1, max_size=30), failures=st.integers(1, 5))
def test_failure_rate_gives_up_when_more_failures_than_it_allows_fall_in_its_interval(
    gaps: list[float], failures: int
) -> None:
    restarts = Restarts(FailureRate(failures, interval=60, delay=0.5))
    now, times = 0.0, []
    for gap in gaps:
        now += gap
        times.append(now)
        decision = restarts.after(failure(), now)
        if len([t for t in times if now - t < 60]) > failures:
            assert isinstance(decision, GiveUp) and "more than FailureRate(" in decision.why
            return
        assert decision == Restart(0.5)


def test_fixed_delay_and_no_restart() -> None:
    restarts = Restarts(FixedDelay(2, dt.timedelta(milliseconds=250)))
    assert [restarts.after(failure(n), n) for n in range(2)] == [Restart(0.25)] * 2
    last = restarts.after(failure(2), 2)
    assert isinstance(last, GiveUp) and last.why == (
        "FixedDelay(attempts=2, delay=0.25) used its 2 restart(s)"
    )
    none = Restarts(NoRestart()).after(failure(), 0)
    assert none == GiveUp("its restart strategy is NoRestart()")


kinds = st.sampled_from(["a", "b"])


@given(
    strategy=st.sampled_from([ExponentialDelay(attempts=None), FixedDelay(10**6, 0), NoRestart()]),
    failures=st.lists(st.tuples(kinds, st.none() | kinds, st.booleans()), max_size=40),
)
@settings(max_examples=300)
def test_the_same_record_twice_in_a_row_gives_up_whatever_the_strategy(
    strategy: Any, failures: list[tuple[str, str | None, bool]]
) -> None:
    """A failure at a record, not of a passing kind, the same as the one before it (operator,
    record, error) is deterministic; nothing else is."""
    restarts = Restarts(strategy)
    before = None
    for n, (error, record, passing) in enumerate(failures):
        this = Failure("task", f"E: {error}", "s-1", "op", record, None, passing)
        decision = restarts.after(this, float(n))
        same = signature(this)
        if same is not None and same == before:
            assert isinstance(decision, GiveUp) and decision.deterministic
            assert "a restart cannot help" in decision.why
            return
        assert not (isinstance(decision, GiveUp) and decision.deterministic)
        if isinstance(decision, GiveUp):  # (NoRestart)
            return
        before = same


def test_object_addresses_do_not_make_two_failures_differ() -> None:
    a = failure(record="<Row object at 0x7f00aa>")
    b = failure(record="<Row object at 0x7f11bb>")
    assert signature(a) == signature(b)
    assert signature(failure(record="{'n': 1}", passing=True)) is None
    assert signature(failure()) is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedDelay(-1), "FixedDelay: attempts must be an integer of 0 or more, not -1"),
        (lambda: FixedDelay(1, "soon"), "FixedDelay: delay='soon' is not a duration"),
        (
            lambda: ExponentialDelay(initial="2min", maximum="1min"),
            r"maximum \(1 min\) must be at least initial \(2 min\)",
        ),
        (lambda: ExponentialDelay(multiplier=0.5), "multiplier must be a number of 1 or more"),
        (lambda: ExponentialDelay(jitter=2), "jitter must be a fraction from 0 to 1, not 2"),
        (lambda: FailureRate(0), "FailureRate: failures must be an integer of 1 or more, not 0"),
    ],
)
def test_a_strategy_that_cannot_work_is_refused_when_made(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_the_deprecated_keywords_are_a_fixed_delay_and_say_so(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"restart_strategy=FixedDelay\(attempts=2, "):
        env = StreamEnvironment(1, restart_attempts=2, restart_delay="0.5s")
    assert env.settings.restart == FixedDelay(2, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert StreamEnvironment(1).settings.restart == ExponentialDelay()
    with pytest.raises(ValueError, match="both say how to restart"):
        StreamEnvironment(1, restart_strategy=NoRestart(), restart_attempts=1)
    with pytest.raises(TypeError, match="restart_strategy must be ExponentialDelay"):
        StreamEnvironment(1, restart_strategy=3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- jobs


def environment(tmp_path: Path, strategy: Any, **options: Any) -> StreamEnvironment:
    return StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        dead_letter_dir=tmp_path / "dead",
        restart_strategy=strategy,
        **options,
    )


class Heard(JobListener):
    def __init__(self) -> None:
        self.events: list[JobEvent] = []

    def on_event(self, event: JobEvent) -> None:
        self.events.append(event)


def seven(record: dict[str, int]) -> dict[str, int]:
    if record["value"] == 7:
        raise ValueError("seven is a bad value")
    return record


def test_a_deterministic_error_fails_at_once_though_restarts_are_left(tmp_path: Path) -> None:
    env = environment(tmp_path, ExponentialDelay(initial=0.01, jitter=0))
    env.from_sequence(0, 20).map(seven).collect()
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    message = str(failed.value)
    assert message.startswith("the job failed after 2 attempt(s), not restarted: it failed at ")
    assert "the same record in the same operator with the same error in two attempts" in message
    assert "a restart cannot help (on_error='dead_letter' on that operator" in message
    assert "record: {'value': 7}" in message and "ValueError: seven is a bad value" in message
    assert failed.value.deterministic and failed.value.operator == "map(seven)"


def test_with_dead_letters_the_record_is_kept_aside_and_the_job_goes_on(tmp_path: Path) -> None:
    env = environment(tmp_path, ExponentialDelay(initial=0.01, jitter=0))
    env.from_sequence(0, 20).map(seven, on_error="dead_letter").collect()
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert sorted(r["value"] for r in result.output) == [v for v in range(20) if v != 7]
    assert [json_value(d) for d in dead_letters(tmp_path / "dead")] == [{"value": 7}]
    assert not result.restarts


def json_value(row: dict[str, Any]) -> Any:
    import json

    return json.loads(row["record"])


@dataclass(frozen=True)
class DownFor:
    """A call to a service that is down for the first ``attempts`` attempts of the job: at
    record 7 it raises ``ConnectionRefusedError`` (an ``OSError``: of the kind that passes)
    until ``attempts`` flag files were made."""

    attempts: int
    folder: str

    @property
    def __name__(self) -> str:
        return "call_service"

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record["value"] == 7:
            for n in range(self.attempts):
                if first_time(f"{self.folder}/down-{n}"):
                    raise ConnectionRefusedError(f"service down (attempt {n + 1})")
        return record


def test_an_error_that_passes_at_the_same_record_is_restarted_until_it_passes(
    tmp_path: Path,
) -> None:
    """The same record fails four attempts in a row, with an error that passes (a service
    that is down): restarted each time, ever later, and the job ends exact once it is back."""
    strategy = ExponentialDelay(initial=0.01, multiplier=2, jitter=0)
    env = environment(tmp_path, strategy)
    env.from_sequence(0, 20).map(DownFor(4, str(tmp_path))).collect()
    heard = Heard()
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False, listener=heard)
    assert sorted(r["value"] for r in result.output) == list(range(20))
    delays = [e.delay for e in heard.events if isinstance(e, Restarting)]
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.08])
    assert [r.delay for r in result.restarts] == pytest.approx(delays)
    assert all("ConnectionRefusedError: service down" in r.cause for r in result.restarts)
    verdict = repr(result)
    assert "4 restarts (generation 1: " in verdict and "(restarted after 0.0 s)" in verdict


@dataclass(frozen=True)
class EachOnce:
    """Fails once at each of ``values`` (a flag file each): failures at different records."""

    values: tuple[int, ...]
    folder: str

    @property
    def __name__(self) -> str:
        return "each_once"

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        value = record["value"]
        if value in self.values and first_time(f"{self.folder}/once-{value}"):
            raise ValueError(f"once at {value}")
        return record


@pytest.mark.parametrize(
    ("strategy", "fails"),
    [
        (FixedDelay(2, 0), 3),
        (FixedDelay(3, 0), None),
        (FailureRate(2, interval="1h", delay=0), 3),
        (NoRestart(), 1),
    ],
)
def test_each_strategy_restarts_as_it_says(
    tmp_path: Path, strategy: Any, fails: int | None
) -> None:
    """Three failures, each at another record: a strategy that allows three restarts ends
    the job exact; one that allows fewer gives up at the one too many, saying why."""
    env = environment(tmp_path, strategy)
    env.from_sequence(0, 30).map(EachOnce((5, 15, 25), str(tmp_path))).collect()
    if fails is None:
        result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
        assert sorted(r["value"] for r in result.output) == list(range(30))
        assert len(result.restarts) == 3
        return
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert f"the job failed after {fails} attempt(s), not restarted: " in str(failed.value)
    assert repr(strategy) in str(failed.value) and not failed.value.deterministic
