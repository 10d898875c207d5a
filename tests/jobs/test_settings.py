"""The settings groups (``Checkpoints``, ``State``, ``Timeouts``), the common settings flat
beside them, the flat keywords of before the groups (deprecated aliases that still work and
warn once), and the test seams in ``cutline.testing`` (deprecated in ``execute()``)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args

import pytest

from cutline import (
    Checkpoints,
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    SourceHold,
    State,
    StreamEnvironment,
    Timeouts,
    testing,
)
from cutline.api.setting_groups import CheckpointingMode, HostLossPolicy, StateBackend
from cutline.api.settings import DEPRECATED, DeprecatedSettings
from cutline.runtime.driver.restart import HOST_LOSS_POLICIES
from cutline.runtime.state.config import BACKENDS
from cutline.runtime.task.launch import CHECKPOINTING_MODES
from cutline.runtime.task.local import ThreadLauncher


@contextlib.contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ------------------------------------------------------------------------------ the groups


def test_a_group_reads_its_durations_and_places_when_made() -> None:
    checkpoints = Checkpoints(
        interval=timedelta(milliseconds=500), timeout="2min", dir="ck", savepoint_dir=Path("sp")
    )
    assert (checkpoints.interval, checkpoints.timeout) == (0.5, 120.0)
    assert checkpoints.dir == str(Path("ck").absolute())
    assert checkpoints.savepoint_dir == str(Path("sp").absolute())
    assert Checkpoints(dir="s3://bucket/ck").dir == "s3://bucket/ck"
    assert Checkpoints(interval="1s") == Checkpoints(interval=1) == Checkpoints()
    assert Timeouts(heartbeat="500ms").heartbeat == 0.5
    assert State(dir=Path("state")).dir == "state"  # (each worker's own, as written)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Checkpoints().retained = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Checkpoints(interval=0), "Checkpoints.interval must be a finite duration greater"),
        (lambda: Checkpoints(timeout="soon"), "Checkpoints.timeout='soon' is not a duration"),
        (lambda: Checkpoints(min_pause=-1), "Checkpoints.min_pause must be a finite duration of 0"),
        (lambda: Checkpoints(tolerable_failures=-1), "Checkpoints.tolerable_failures must be an"),
        (lambda: Checkpoints(retained=0), "Checkpoints.retained must be an integer of 1 or more"),
        (lambda: Checkpoints(dir=3), "Checkpoints.dir must be a path or a URL, not 3"),
        (lambda: Timeouts(heartbeat=0), "Timeouts.heartbeat must be a finite duration greater"),
        (lambda: Timeouts(start=float("inf")), "Timeouts.start must be a finite duration"),
        (lambda: Timeouts(slots=-1), "Timeouts.slots must be a finite duration of 0 s or more"),
        (lambda: State(backend="ram"), "State.backend must be one of 'memory', 'disk', not 'ram'"),
    ],
)
def test_a_field_that_cannot_work_is_refused_naming_it_and_its_value(
    make: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_each_group_documents_every_field_and_its_literals_are_the_runtime_s() -> None:
    for group in (Checkpoints, State, Timeouts, ExponentialDelay, FixedDelay, FailureRate):
        documented = re.findall(r":param (\w+):", group.__doc__ or "")
        assert documented == [f.name for f in dataclasses.fields(group)], group
    assert get_args(CheckpointingMode) == CHECKPOINTING_MODES
    assert get_args(StateBackend) == BACKENDS
    assert get_args(HostLossPolicy) == HOST_LOSS_POLICIES


# ------------------------------------------------------------- the environment takes them


def test_the_groups_become_the_runtime_s_settings() -> None:
    with no_warnings():
        env = StreamEnvironment(
            3,
            checkpoints=Checkpoints(
                interval="2s",
                dir="s3://b/ck",
                timeout=30,
                min_pause="100ms",
                tolerable_failures=2,
                retained=4,
                mode="aligned",
                alignment_timeout="50ms",
                savepoint_dir="s3://b/sp",
            ),
            state=State(backend="disk", incremental=False, full_every=5, dir="/d", memory=2**21),
            timeouts=Timeouts(heartbeat=5, start=6, restore=7, commit=8, slots=9),
            restart_strategy=FixedDelay(2, 0),
            on_host_loss="wait",
        )
    s = env.settings
    assert (s.checkpoints.interval, s.checkpoints.timeout, s.checkpoints.min_pause) == (2, 30, 0.1)
    assert (s.checkpoints.tolerable_failures, s.checkpoints.retained) == (2, 4)
    assert (s.barriers.mode, s.barriers.alignment_timeout) == ("aligned", 0.05)
    assert (s.checkpoint_dir, s.savepoint_dir) == ("s3://b/ck", "s3://b/sp")
    assert (s.state.backend, s.state.incremental, s.state.full_every) == ("disk", False, 5)
    assert (s.state.local_dir, s.state.memory) == ("/d", 2**21)
    assert dataclasses.astuple(s.deadlines) == (5, 6, 7, 8, 9)
    assert (s.restart, s.on_host_loss) == (FixedDelay(2, 0), "wait")


def test_a_common_setting_given_flat_fills_in_its_group() -> None:
    with no_warnings():
        env = StreamEnvironment(
            checkpoint_dir="ck", checkpoints=Checkpoints(retained=3, interval=timedelta(seconds=5))
        )
        assert env.settings.checkpoint_dir == str(Path("ck").absolute())
        assert (env.settings.checkpoints.retained, env.settings.checkpoints.interval) == (3, 5)
        flat = StreamEnvironment(checkpoint_interval=None, checkpoints=Checkpoints(retained=2))
        assert flat.settings.checkpoints.interval is None
        same = StreamEnvironment(checkpoint_interval=2, checkpoints=Checkpoints(interval="2s"))
        assert same.settings.checkpoints.interval == 2


def test_a_group_and_a_flat_keyword_that_say_different_things_are_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("checkpoint_interval='2s' and checkpoints=")):
        StreamEnvironment(checkpoint_interval="2s", checkpoints=Checkpoints(interval="3s"))
    # (the flat keyword's default, given, is said: not left out)
    with pytest.raises(ValueError, match=re.escape("checkpoint_interval='1s' and checkpoints=")):
        StreamEnvironment(checkpoint_interval="1s", checkpoints=Checkpoints(interval="10s"))
    with pytest.raises(ValueError, match="say different things: give it once"):
        StreamEnvironment(checkpoint_dir="a", checkpoints=Checkpoints(dir="b"))
    with pytest.raises(ValueError, match=re.escape("state_backend='memory' and state=State(")):
        StreamEnvironment(state_backend="memory", state=State(backend="disk"))


def test_a_group_of_the_wrong_kind_or_an_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"state must be a State\(...\) \(from cutline\), not"):
        StreamEnvironment(state=Checkpoints())  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"'chekpoint_interval' \(did you mean checkpoint_interval\?\)"
    ):
        StreamEnvironment(chekpoint_interval=1)  # type: ignore[call-arg]


# ------------------------------------------------------------------ the deprecated keywords

OLD_AND_NEW: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"checkpoint_timeout": "1min"}, {"checkpoints": Checkpoints(timeout="1min")}),
    ({"min_pause": 1}, {"checkpoints": Checkpoints(min_pause=1)}),
    ({"tolerable_failed_checkpoints": 2}, {"checkpoints": Checkpoints(tolerable_failures=2)}),
    ({"retained_checkpoints": 3}, {"checkpoints": Checkpoints(retained=3)}),
    ({"max_concurrent_checkpoints": 2}, {"checkpoints": Checkpoints(max_concurrent=2)}),
    ({"checkpointing": "unaligned"}, {"checkpoints": Checkpoints(mode="unaligned")}),
    ({"alignment_timeout": 0.1}, {"checkpoints": Checkpoints(alignment_timeout=0.1)}),
    ({"savepoint_dir": "sp"}, {"checkpoints": Checkpoints(savepoint_dir="sp")}),
    ({"state_backend": "disk"}, {"state": State(backend="disk")}),
    ({"incremental_checkpoints": False}, {"state": State(incremental=False)}),
    ({"full_checkpoint_every": 4}, {"state": State(full_every=4)}),
    ({"state_dir": "/tmp/s"}, {"state": State(dir="/tmp/s")}),
    ({"state_memory": 2**21}, {"state": State(memory=2**21)}),
    ({"heartbeat_timeout": 3}, {"timeouts": Timeouts(heartbeat=3)}),
    ({"start_timeout": 3}, {"timeouts": Timeouts(start=3)}),
    ({"restore_timeout": 3}, {"timeouts": Timeouts(restore=3)}),
    ({"commit_timeout": 3}, {"timeouts": Timeouts(commit=3)}),
    ({"slot_timeout": 3}, {"timeouts": Timeouts(slots=3)}),
    ({"restart_attempts": 2, "restart_delay": 0}, {"restart_strategy": FixedDelay(2, 0)}),
]


def test_every_deprecated_keyword_is_in_the_table() -> None:
    old = {name for given, _ in OLD_AND_NEW for name in given}
    assert (
        old
        == set(DeprecatedSettings.__annotations__)
        == {
            *DEPRECATED,
            "restart_attempts",
            "restart_delay",
        }
    )


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW, ids=lambda o: ",".join(o))
def test_a_deprecated_keyword_still_works_and_says_what_to_write_instead(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        env = StreamEnvironment(2, **old)
    assert len(caught) == 1
    (keyword, group), *_ = new.items()
    said = str(caught[0].message)
    assert said.startswith("deprecated keywords of StreamEnvironment: instead of ")
    assert f"write {keyword}={type(group).__name__}(" in said
    assert caught[0].filename == __file__  # (the warning points at the call)
    with no_warnings():
        assert env.settings == StreamEnvironment(2, **new).settings


def test_several_deprecated_keywords_warn_once_naming_each_replacement() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        env = StreamEnvironment(
            state_backend="disk",
            state_dir="/s",
            retained_checkpoints=3,
            heartbeat_timeout=5,
            restart_attempts=1,
        )
    [warning] = caught
    assert str(warning.message) == (
        "deprecated keywords of StreamEnvironment: "
        "instead of retained_checkpoints=3 write checkpoints=Checkpoints(retained=3); "
        "instead of state_backend='disk', state_dir='/s' write state=State(backend='disk', "
        "dir='/s'); "
        "instead of heartbeat_timeout=5 write timeouts=Timeouts(heartbeat=5); "
        "instead of restart_attempts=1 write restart_strategy=FixedDelay(attempts=1, "
        "delay=1.0) (or another strategy: ExponentialDelay, the default, FailureRate, NoRestart)"
    )
    assert (env.settings.state.backend, env.settings.checkpoints.retained) == ("disk", 3)
    assert env.settings.restart == FixedDelay(1, 1.0)


def test_a_deprecated_keyword_fills_in_a_group_given_beside_it() -> None:
    with pytest.warns(DeprecationWarning, match=r"write state=State\(backend='disk'\)"):
        env = StreamEnvironment(state_backend="disk", state=State(memory=2**21))
    assert (env.settings.state.backend, env.settings.state.memory) == ("disk", 2**21)


def test_a_deprecated_keyword_s_bad_value_is_named_as_it_was_written() -> None:
    with pytest.raises(ValueError, match="retained_checkpoints must be an integer of 1 or more"):
        StreamEnvironment(retained_checkpoints=0)
    with pytest.raises(
        ValueError,
        match=r"Checkpoints.max_concurrent must be 1 with mode='unaligned', not 2 \(given as "
        r"max_concurrent_checkpoints=2, checkpointing='unaligned'\)",
    ):
        StreamEnvironment(max_concurrent_checkpoints=2, checkpointing="unaligned")


def test_the_default_is_no_warning_and_the_default_strategy() -> None:
    with no_warnings():
        assert StreamEnvironment(1).settings.restart == ExponentialDelay()


# -------------------------------------------------------------------------- cutline.testing


def job(tmp_path: Path, name: str) -> StreamEnvironment:
    env = StreamEnvironment(
        2, checkpoint_interval=0.05, checkpoint_dir=tmp_path / name, batch_size=50
    )
    env.from_sequence(0, 1000).key_by("value").count().collect()
    return env


def test_testing_execute_takes_the_seams_and_every_keyword_of_execute(tmp_path: Path) -> None:
    with no_warnings():
        result = testing.execute(
            job(tmp_path, "ck"),
            launcher=ThreadLauncher(),
            hold_sources=SourceHold(records=250),
            on_ready=lambda generation, pids: None,
            progress=False,
        )
    assert len(result.output) == 1000
    assert len(result.checkpoints) >= 2  # (a periodic one released the hold, and the final)
    ours = inspect.signature(testing.execute).parameters
    theirs = inspect.signature(StreamEnvironment.execute).parameters
    assert {p for p in theirs if p not in ("self", "seams")} <= set(ours)


def test_the_seams_given_to_execute_still_work_and_warn(tmp_path: Path) -> None:
    env = job(tmp_path, "ck")
    with pytest.warns(DeprecationWarning) as caught:
        result = env.execute(launcher=ThreadLauncher(), hold_sources=SourceHold(250))
    [warning] = caught
    assert str(warning.message) == (
        "execute(launcher=..., hold_sources=...) is deprecated: these are test seams, taken by "
        "cutline.testing.execute(env, launcher=..., hold_sources=..., ...) (same keywords as "
        "execute())"
    )
    assert warning.filename == __file__
    assert len(result.output) == 1000
    with pytest.raises(TypeError, match="unexpected keyword argument 'hold_source'"):
        env.execute(hold_source=SourceHold(1))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="hold_sources takes a SourceHold, not 3"):
        testing.execute(env, hold_sources=3)  # type: ignore[arg-type]
