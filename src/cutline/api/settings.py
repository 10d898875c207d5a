"""How a job runs: the keywords of :class:`~cutline.api.StreamEnvironment`, checked once, here,
into a :class:`Settings` of the runtime's own objects.

The user writes the groups of :mod:`cutline.api.setting_groups` (``checkpoints=Checkpoints(...)``,
``state=State(...)``, ``timeouts=Timeouts(...)``), the restart strategy, and a few common
settings flat (``checkpoint_interval=``, ``checkpoint_dir=``, ...). A flat keyword of a group
fills that field in: ``StreamEnvironment(checkpoint_dir="ck", checkpoints=Checkpoints(retained=3))``
is ``Checkpoints(dir="ck", retained=3)``; a group's field set (to other than its default) and a
flat keyword saying something else is a ``ValueError``. The flat keywords of every other
setting, from before the groups, still work, each a field of its group, with one
``DeprecationWarning`` per call saying what to write instead.

A setting that cannot work is refused when the environment is made, naming the keyword or
field and the value, never when the job runs.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from cutline.api.setting_groups import (
    GROUPS,
    CheckpointingMode,
    Checkpoints,
    HostLossPolicy,
    Place,
    State,
    StateBackend,
    Timeouts,
    location,
)
from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.driver.config import Deadlines
from cutline.runtime.driver.restart import (
    HOST_LOSS_POLICIES,
    RESTART_STRATEGIES,
    ExponentialDelay,
    FixedDelay,
    RestartStrategy,
)
from cutline.runtime.durations import Duration, seconds
from cutline.runtime.state.config import Backend, StateConfig
from cutline.runtime.task.launch import BarrierHandling, Checkpointing

__all__ = ["DeprecatedSettings", "Settings", "location"]


class DeprecatedSettings(TypedDict, total=False):
    """The keywords ``StreamEnvironment`` took before the groups: each still works, with a
    ``DeprecationWarning`` naming what to write instead (``DEPRECATED``)."""

    checkpoint_timeout: Duration
    min_pause: Duration
    tolerable_failed_checkpoints: int
    retained_checkpoints: int
    max_concurrent_checkpoints: int
    checkpointing: CheckpointingMode
    alignment_timeout: Duration | None
    savepoint_dir: Place | None
    state_backend: StateBackend
    incremental_checkpoints: bool
    full_checkpoint_every: int
    state_dir: Place | None
    state_memory: int
    heartbeat_timeout: Duration
    start_timeout: Duration
    restore_timeout: Duration
    commit_timeout: Duration
    slot_timeout: Duration
    restart_attempts: int | None
    restart_delay: Duration | None


DEPRECATED: dict[str, tuple[str, str]] = {
    "checkpoint_timeout": ("checkpoints", "timeout"),
    "min_pause": ("checkpoints", "min_pause"),
    "tolerable_failed_checkpoints": ("checkpoints", "tolerable_failures"),
    "retained_checkpoints": ("checkpoints", "retained"),
    "max_concurrent_checkpoints": ("checkpoints", "max_concurrent"),
    "checkpointing": ("checkpoints", "mode"),
    "alignment_timeout": ("checkpoints", "alignment_timeout"),
    "savepoint_dir": ("checkpoints", "savepoint_dir"),
    "state_backend": ("state", "backend"),
    "incremental_checkpoints": ("state", "incremental"),
    "full_checkpoint_every": ("state", "full_every"),
    "state_dir": ("state", "dir"),
    "state_memory": ("state", "memory"),
    "heartbeat_timeout": ("timeouts", "heartbeat"),
    "start_timeout": ("timeouts", "start"),
    "restore_timeout": ("timeouts", "restore"),
    "commit_timeout": ("timeouts", "commit"),
    "slot_timeout": ("timeouts", "slots"),
}
"""A deprecated flat keyword -> (its group's keyword, its field there). ``restart_attempts``
and ``restart_delay`` are ``restart_strategy=FixedDelay(attempts, delay)``."""

COMMON: dict[str, tuple[str, str]] = {
    "checkpoint_interval": ("checkpoints", "interval"),
    "checkpoint_dir": ("checkpoints", "dir"),
}
"""The flat keywords of a group's field that are not deprecated (the common ones)."""


class _Unsaid(str):
    """A default of ``StreamEnvironment``'s signature, told apart (by identity) from the same
    value given: ``checkpoint_interval="1s"`` beside ``Checkpoints(interval="10s")`` says two
    different things, ``checkpoint_interval`` left out says nothing."""

    __slots__ = ()


DEFAULT_INTERVAL = _Unsaid("1s")
"""``checkpoint_interval``'s default (``"1s"``, as ``Checkpoints.interval``'s)."""

_COMMON_DEFAULTS: dict[str, Any] = {"checkpoint_interval": DEFAULT_INTERVAL, "checkpoint_dir": None}
"""Their defaults in ``StreamEnvironment``'s signature: a flat keyword left at it (the very
object) says nothing."""


def _count(value: Any, what: str, least: int) -> int:
    """An integer of at least ``least`` (``True`` is no count)."""
    if type(value) is not int or value < least:
        wanted = "a positive integer" if least == 1 else f"{least} or more"
        raise ValueError(f"{what} must be {wanted}, not {value!r}")
    return value


def _said(fields: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in fields.items())


def _restart_strategy(
    strategy: RestartStrategy | None, old: Mapping[str, Any]
) -> tuple[RestartStrategy, str | None]:
    """``restart_strategy=``, or the fixed delay the deprecated ``restart_attempts=`` and
    ``restart_delay=`` say (and what to write instead), or the default: ExponentialDelay."""
    attempts, delay = old.get("restart_attempts"), old.get("restart_delay")
    if attempts is None and delay is None:
        if strategy is None:
            return ExponentialDelay(), None
        if not isinstance(strategy, RESTART_STRATEGIES):
            raise TypeError(
                "restart_strategy must be ExponentialDelay(...), FixedDelay(...), "
                f"FailureRate(...) or NoRestart() (from cutline), not {strategy!r:.100}"
            )
        return strategy, None
    if strategy is not None:
        raise ValueError(
            "restart_strategy= and restart_attempts=/restart_delay= both say how to restart: "
            "pass restart_strategy only"
        )
    fixed = FixedDelay(
        3 if attempts is None else _count(attempts, "restart_attempts", 0),
        1.0 if delay is None else seconds(delay, "restart_delay") or 0.0,
    )
    instead = (
        f"instead of {_said({k: old[k] for k in ('restart_attempts', 'restart_delay') if k in old})}"
        f" write restart_strategy={fixed} (or another strategy: ExponentialDelay, the default, "
        "FailureRate, NoRestart)"
    )
    return fixed, instead


def _group(keyword: str, given: Any) -> Any:
    """The group given as ``keyword=`` (``None``: its defaults), or a TypeError."""
    kind = GROUPS[keyword]
    if given is None:
        return kind()
    if not isinstance(given, kind):
        raise TypeError(f"{keyword} must be a {kind.__name__}(...) (from cutline), not {given!r}")
    return given


def _groups(
    arguments: Mapping[str, Any], old: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Every group, with the flat keywords that fill its fields in (each checked as the
    keyword it was given as), and what to write instead of the deprecated ones."""
    groups = {keyword: _group(keyword, arguments[keyword]) for keyword in GROUPS}
    flat: dict[str, dict[str, tuple[str, Any]]] = {keyword: {} for keyword in GROUPS}
    for name, (keyword, field) in COMMON.items():
        if arguments[name] is not _COMMON_DEFAULTS[name]:
            flat[keyword][field] = (name, arguments[name])
    for name, value in old.items():
        if name in DEPRECATED:
            keyword, field = DEPRECATED[name]
            flat[keyword][field] = (name, value)
    instead = []
    for keyword, filled in flat.items():
        if not filled:
            continue
        group = groups[keyword]
        kind = type(group)
        set_already = group.given()
        values = {}
        for field, (name, value) in filled.items():
            checked = kind.check_field(field, value, name)
            if field in set_already and set_already[field] != checked:
                raise ValueError(
                    f"{name}={value!r} and {keyword}={kind.__name__}({field}="
                    f"{set_already[field]!r}) say different things: give it once, as "
                    f"{keyword}={kind.__name__}({field}=...)"
                )
            values[field] = checked
        try:
            groups[keyword] = replace(group, **values)
        except ValueError as exc:  # fields that do not go together, one of them given flat
            given = _said(dict(filled.values()))
            raise ValueError(f"{exc} (given as {given})") from None
        old_ones = {name: value for field, (name, value) in filled.items() if name in DEPRECATED}
        if old_ones:
            fields = {DEPRECATED[name][1]: value for name, value in old_ones.items()}
            instead.append(
                f"instead of {_said(old_ones)} write {keyword}={kind.__name__}({_said(fields)})"
            )
    return groups, instead


def _host_loss(value: Any) -> HostLossPolicy:
    if value not in HOST_LOSS_POLICIES:
        raise ValueError(
            f"on_host_loss must be one of {', '.join(map(repr, HOST_LOSS_POLICIES))}, not {value!r}"
        )
    return value  # type: ignore[no-any-return]


def _refuse_unknown(old: Mapping[str, Any]) -> None:
    for name in old:
        if name not in DEPRECATED and name not in ("restart_attempts", "restart_delay"):
            known = [*DEPRECATED, *COMMON, *GROUPS, "restart_strategy", "parallelism"]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise TypeError(
                f"StreamEnvironment() got an unexpected keyword argument {name!r}{hint}"
            )


@dataclass(frozen=True)
class Settings:
    """The checked settings of one :class:`~cutline.api.StreamEnvironment`, as the runtime
    takes them: its settings objects, and the places and sizes. Durations are seconds;
    places are absolute paths or URLs."""

    parallelism: int
    max_parallelism: int
    checkpoints: CheckpointSettings
    barriers: BarrierHandling
    state: StateConfig
    restart: RestartStrategy
    on_host_loss: str
    deadlines: Deadlines
    checkpoint_dir: str | None
    savepoint_dir: str | None
    dead_letter_dir: str | None
    batch_size: int
    buffer_capacity: int
    storage_options: dict[str, Any] | None

    @classmethod
    def check(
        cls, arguments: Mapping[str, Any], deprecated: Mapping[str, Any] | None = None
    ) -> Settings:
        """The settings of ``StreamEnvironment(**arguments, **deprecated)`` (``arguments``:
        every keyword of its signature; ``deprecated``: the old flat keywords given, which
        warn once, saying what to write instead), or a ``ValueError`` naming the first
        keyword or field that cannot work and why."""
        a, old = arguments, dict(deprecated or {})
        _refuse_unknown(old)
        parallelism = _count(a["parallelism"], "parallelism", 1)
        if type(a["max_parallelism"]) is not int or a["max_parallelism"] < parallelism:
            raise ValueError(
                f"max_parallelism must be an integer of at least parallelism ({parallelism}), "
                f"not {a['max_parallelism']!r}"
            )
        groups, instead = _groups(a, old)
        restart, restart_instead = _restart_strategy(a["restart_strategy"], old)
        if restart_instead is not None:
            instead.append(restart_instead)
        if instead:
            warnings.warn(
                "deprecated keywords of StreamEnvironment: " + "; ".join(instead),
                DeprecationWarning,
                stacklevel=3,  # (the user's call, through StreamEnvironment.__init__)
            )
        return cls.of(
            parallelism=parallelism,
            max_parallelism=a["max_parallelism"],
            checkpoints=groups["checkpoints"],
            state=groups["state"],
            timeouts=groups["timeouts"],
            restart=restart,
            on_host_loss=_host_loss(a["on_host_loss"]),
            dead_letter_dir=a["dead_letter_dir"],
            batch_size=_count(a["batch_size"], "batch_size", 1),
            buffer_capacity=_count(a["buffer_capacity"], "buffer_capacity", 1),
            storage_options=a["storage_options"],
        )

    @classmethod
    def of(
        cls,
        *,
        parallelism: int,
        max_parallelism: int,
        checkpoints: Checkpoints,
        state: State,
        timeouts: Timeouts,
        restart: RestartStrategy,
        on_host_loss: str,
        dead_letter_dir: Place | None,
        batch_size: int,
        buffer_capacity: int,
        storage_options: dict[str, Any] | None,
    ) -> Settings:
        """The runtime's objects for the checked groups (durations already seconds)."""
        c = checkpoints
        return cls(
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            checkpoints=CheckpointSettings(
                interval=_seconds(c.interval),
                timeout=_secs(c.timeout),
                min_pause=_secs(c.min_pause),
                tolerable_failures=c.tolerable_failures,
                retained=c.retained,
                max_concurrent=c.max_concurrent,
            ),
            barriers=BarrierHandling(Checkpointing(c.mode), _seconds(c.alignment_timeout)),
            state=StateConfig(
                backend=Backend(state.backend),
                incremental=state.incremental,
                full_every=state.full_every,
                local_dir=os.fspath(state.dir) if state.dir is not None else None,
                memory=state.memory,
            ),
            restart=restart,
            on_host_loss=on_host_loss,
            deadlines=Deadlines(
                heartbeat=_secs(timeouts.heartbeat),
                start=_secs(timeouts.start),
                restore=_secs(timeouts.restore),
                commit=_secs(timeouts.commit),
                slots=_secs(timeouts.slots),
            ),
            checkpoint_dir=_text(c.dir),
            savepoint_dir=_text(c.savepoint_dir),
            dead_letter_dir=location(dead_letter_dir) if dead_letter_dir is not None else None,
            batch_size=batch_size,
            buffer_capacity=buffer_capacity,
            storage_options=storage_options,
        )


def _seconds(value: Duration | None) -> float | None:
    """A group's duration, which it made seconds when it was made."""
    assert value is None or isinstance(value, float)
    return value


def _secs(value: Duration) -> float:
    """A group's duration that cannot be ``None``, in seconds."""
    assert isinstance(value, float)
    return value


def _text(value: Place | None) -> str | None:
    """A group's place, which it made a text when it was made."""
    assert value is None or isinstance(value, str)
    return value
