"""One grammar for every duration (:mod:`cutline.runtime.durations`): text with a unit, a
``timedelta``, or a bare number of seconds, read the same by the settings, event time,
windows and the command line; a bare number that was probably meant as milliseconds (the
meaning the event-time keywords gave it before) is warned about once per keyword."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cutline import (
    BoundedOutOfOrderness,
    DurationWarning,
    EventTimeError,
    Session,
    Sliding,
    StreamEnvironment,
    Tumbling,
)
from cutline.cli import main
from cutline.runtime import durations
from cutline.runtime.durations import milliseconds, seconds


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    """Each test sees the once-per-keyword warnings anew."""
    saved = set(durations._warned)
    durations._warned.clear()
    yield
    durations._warned.clear()
    durations._warned.update(saved)


@pytest.mark.parametrize(
    ("written", "ms"),
    [
        ("500ms", 500),
        ("500 ms", 500),
        (" 3s ", 3000),
        ("1.5 s", 1500),
        (".5s", 500),
        ("2 sec", 2000),
        ("10 seconds", 10_000),
        ("1 min", 60_000),
        ("5m", 300_000),
        ("2 Minutes", 120_000),
        ("2h", 7_200_000),
        ("1 hour", 3_600_000),
        ("1d", 86_400_000),
        ("2 days", 172_800_000),
        ("1 millisecond", 1),
        (3, 3000),
        (0.25, 250),
        (1.1, 1100),
        (dt.timedelta(minutes=1, milliseconds=5), 60_005),
    ],
)
def test_every_spelling_reads_the_same_in_milliseconds_and_in_seconds(
    written: object, ms: int
) -> None:
    assert milliseconds(written, "x") == ms  # type: ignore[arg-type]
    assert seconds(written, "x") == pytest.approx(ms / 1000)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("5", r"x='5' has no unit: write '5s'"),
        ("5M", r"'M' may be read as months or minutes: write '5min'"),
        ("3 parsecs", r"unknown unit 'parsecs' \(use ms, s, min, h or d"),
        ("-5s", r"x='-5s' is not a duration: give text with a unit"),
        ("soon", r"x='soon' is not a duration"),
        ("1e3ms", r"x='1e3ms' is not a duration"),
        (True, r"x=True is not a duration"),
        (float("nan"), r"x=nan is not a duration"),
        ([1], r"x=\[1\] is not a duration"),
    ],
)
def test_anything_else_is_refused_naming_the_argument_and_the_value(
    written: object, said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        seconds(written, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=said):
        milliseconds(written, "x")  # type: ignore[arg-type]


def test_event_time_takes_whole_milliseconds_and_says_which_bound_it_broke() -> None:
    with pytest.raises(ValueError, match=r"x='0.5ms' is not a whole number of milliseconds"):
        milliseconds("0.5ms", "x")
    with pytest.raises(ValueError, match=r"x=0 must be positive"):
        milliseconds(0, "x")
    assert milliseconds(0, "x", zero=True) == 0
    with pytest.raises(ValueError, match=r"x=-1 must be 0 or more"):
        milliseconds(-1, "x", zero=True)
    with pytest.raises(EventTimeError, match=r"x=inf: give a finite duration"):
        milliseconds(float("inf"), "x", error=EventTimeError)


@given(st.integers(0, 10**12))
def test_milliseconds_written_as_text_read_back_exactly(ms: int) -> None:
    assert milliseconds(f"{ms}ms", "x", zero=True) == ms
    assert milliseconds(durations.said_ms(ms), "x", zero=True) == ms


def test_a_bare_number_is_seconds_everywhere() -> None:
    """The meaning changed for the keywords of event time and windows: ``2`` is 2 s there
    as in the settings."""
    assert Tumbling(2).size == 2000
    assert Sliding(10, every=2).every == 2000
    assert Session(gap=1.5).gap == 1500
    assert Tumbling("1 d", offset=60).offset == 60_000
    assert BoundedOutOfOrderness(2).bound_ms == 2000
    env = StreamEnvironment(1, checkpoint_interval=dt.timedelta(milliseconds=250))
    assert env.settings.checkpoints.interval == 0.25


def test_a_large_bare_number_is_warned_about_once_per_keyword_naming_what_to_write() -> None:
    with pytest.warns(DurationWarning) as caught:
        assert Tumbling(1500).size == 1_500_000
    (warning,) = caught
    assert str(warning.message) == (
        "Tumbling: size=1500 is read as 25 min (a bare number is seconds; it was "
        "milliseconds before): probably meant as ms: write '1500ms' (or '1500s' to keep "
        "seconds and silence this)"
    )
    assert warning.filename == __file__  # (the line that gave it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tumbling(3000)  # (once per keyword)
        Tumbling("1500ms")  # (text is never warned about)
        Tumbling(dt.timedelta(seconds=1500))
        Sliding(999, every=1)  # (below 1,000)
    with pytest.warns(DurationWarning, match=r"Sliding: every=2000 is read as 2000 s"):
        Sliding("4000s", every=2000)


def test_the_command_line_reads_its_durations_with_the_grammar() -> None:
    runner = CliRunner()
    said = runner.invoke(main, ["savepoint", "/nowhere", "--timeout", "5 parsecs"])
    assert said.exit_code == 2
    assert "--timeout='5 parsecs': unknown unit 'parsecs'" in said.output
    said = runner.invoke(main, ["savepoint", "/nowhere", "--timeout", "0"])
    assert said.exit_code == 2 and "--timeout='0' must be a positive duration" in said.output
    assert "[default: 10min]" in runner.invoke(main, ["savepoint", "--help"]).output
