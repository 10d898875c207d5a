"""How a job runs: the keyword arguments of :class:`~cutline.api.StreamEnvironment`, checked
once, here, into a :class:`Settings`.

A setting that cannot work is refused when the environment is made, naming the argument and
the value (``restart_attempts must be 0 or more, not -1``), never when the job runs. Durations
are seconds or text: ``1.5``, ``"500ms"``, ``"1s"``, ``"2min"``, ``"1h"``; places are local
paths (made absolute, so that every process reads the same place) or fsspec URLs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.driver.config import Deadlines
from cutline.runtime.driver.restart import (
    HOST_LOSS_POLICIES,
    RESTART_STRATEGIES,
    ExponentialDelay,
    FixedDelay,
    RestartStrategy,
)
from cutline.runtime.durations import seconds
from cutline.runtime.state.config import StateConfig
from cutline.runtime.task.launch import BarrierHandling


def location(path: str | os.PathLike[str]) -> str:
    """A URL as it is; a local path made absolute, so that it names the same place in every
    process (a Spark executor's working directory is not the driver's)."""
    text = os.fspath(path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def _duration(value: float | int | str, what: str) -> float:
    """A duration that must be given (its bounds are checked by the settings object)."""
    duration = seconds(value, what)
    if duration is None:
        raise ValueError(f"{what} must be a duration, not None")
    return duration


def _count(value: Any, what: str, least: int) -> int:
    """An integer of at least ``least`` (``True`` is no count)."""
    if type(value) is not int or value < least:
        wanted = "a positive integer" if least == 1 else f"{least} or more"
        raise ValueError(f"{what} must be {wanted}, not {value!r}")
    return value


def _restart_strategy(a: Mapping[str, Any]) -> RestartStrategy:
    """``restart_strategy=``, or the fixed delay the deprecated ``restart_attempts=`` and
    ``restart_delay=`` say (with a warning), or the default: :class:`ExponentialDelay`."""
    strategy = a["restart_strategy"]
    attempts, delay = a["restart_attempts"], a["restart_delay"]
    if attempts is None and delay is None:
        if strategy is None:
            return ExponentialDelay()
        if not isinstance(strategy, RESTART_STRATEGIES):
            raise TypeError(
                "restart_strategy must be ExponentialDelay(...), FixedDelay(...), "
                f"FailureRate(...) or NoRestart() (from cutline), not {strategy!r:.100}"
            )
        return strategy
    if strategy is not None:
        raise ValueError(
            "restart_strategy= and restart_attempts=/restart_delay= both say how to restart: "
            "pass restart_strategy only"
        )
    fixed = FixedDelay(
        3 if attempts is None else _count(attempts, "restart_attempts", 0),
        1.0 if delay is None else seconds(delay, "restart_delay") or 0.0,
    )
    warnings.warn(
        f"restart_attempts= and restart_delay= are deprecated: pass restart_strategy={fixed} "
        "(or another strategy: ExponentialDelay, the default, FailureRate, NoRestart)",
        DeprecationWarning,
        stacklevel=4,
    )
    return fixed


def _host_loss(value: Any) -> str:
    if value not in HOST_LOSS_POLICIES:
        raise ValueError(
            f"on_host_loss must be one of {', '.join(map(repr, HOST_LOSS_POLICIES))}, not {value!r}"
        )
    return str(value)


def _place(value: str | os.PathLike[str] | None) -> str | None:
    return location(value) if value is not None else None


@dataclass(frozen=True)
class Settings:
    """The checked settings of one :class:`~cutline.api.StreamEnvironment` (each argument is
    described there): the settings objects the job runs with, each checked when made, and the
    places and sizes. Durations are seconds; places are absolute paths or URLs."""

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
    def check(cls, arguments: Mapping[str, Any]) -> Settings:
        """The settings of ``StreamEnvironment(**arguments)`` (every argument given), or a
        ``ValueError`` naming the first argument that cannot work and why."""
        a = arguments
        parallelism = _count(a["parallelism"], "parallelism", 1)
        if type(a["max_parallelism"]) is not int or a["max_parallelism"] < parallelism:
            raise ValueError(
                f"max_parallelism must be an integer of at least parallelism ({parallelism}), "
                f"not {a['max_parallelism']!r}"
            )
        _count(a["max_concurrent_checkpoints"], "max_concurrent_checkpoints", 1)
        checkpoints = CheckpointSettings(
            interval=seconds(a["checkpoint_interval"], "checkpoint_interval"),
            timeout=seconds(a["checkpoint_timeout"], "checkpoint_timeout") or 0.0,
            min_pause=seconds(a["min_pause"], "min_pause") or 0.0,
            tolerable_failures=a["tolerable_failed_checkpoints"],
            retained=a["retained_checkpoints"],
            max_concurrent=a["max_concurrent_checkpoints"],
        )
        barriers = BarrierHandling(
            a["checkpointing"], seconds(a["alignment_timeout"], "alignment_timeout")
        )
        barriers.check_concurrency(checkpoints.max_concurrent)
        return cls(
            parallelism=parallelism,
            max_parallelism=a["max_parallelism"],
            checkpoints=checkpoints,
            barriers=barriers,
            state=StateConfig(
                backend=a["state_backend"],
                incremental=a["incremental_checkpoints"],
                full_every=a["full_checkpoint_every"],
                local_dir=os.fspath(a["state_dir"]) if a["state_dir"] is not None else None,
                memory=a["state_memory"],
            ),
            restart=_restart_strategy(a),
            on_host_loss=_host_loss(a["on_host_loss"]),
            deadlines=Deadlines(
                heartbeat=_duration(a["heartbeat_timeout"], "heartbeat_timeout"),
                start=_duration(a["start_timeout"], "start_timeout"),
                restore=_duration(a["restore_timeout"], "restore_timeout"),
                commit=_duration(a["commit_timeout"], "commit_timeout"),
                slots=_duration(a["slot_timeout"], "slot_timeout"),
            ),
            checkpoint_dir=_place(a["checkpoint_dir"]),
            savepoint_dir=_place(a["savepoint_dir"]),
            dead_letter_dir=_place(a["dead_letter_dir"]),
            batch_size=_count(a["batch_size"], "batch_size", 1),
            buffer_capacity=_count(a["buffer_capacity"], "buffer_capacity", 1),
            storage_options=a["storage_options"],
        )
