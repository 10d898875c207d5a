"""How a job runs: the keyword arguments of :class:`~cutline.api.StreamEnvironment`, checked
once, here, into a :class:`Settings`.

A setting that cannot work is refused when the environment is made, naming the argument and
the value (``restart_attempts must be 0 or more, not -1``), never when the job runs. Durations
are seconds or text: ``1.5``, ``"500ms"``, ``"1s"``, ``"2min"``, ``"1h"``; places are local
paths (made absolute, so that every process reads the same place) or fsspec URLs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.driver.config import check_host_loss
from cutline.runtime.state.config import BACKENDS, StateConfig
from cutline.runtime.task.launch import CHECKPOINTING_MODES

_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def seconds(value: float | int | str | None, what: str) -> float | None:
    """``1.5``, ``"1s"``, ``"500ms"``, ``"2min"`` -> seconds (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected seconds or a duration like '1s', got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError(
        f"{what}: {value!r} is not a duration (use seconds, or text like '500ms', '1s', '2min')"
    )


def location(path: str | os.PathLike[str]) -> str:
    """A URL as it is; a local path made absolute, so that it names the same place in every
    process (a Spark executor's working directory is not the driver's)."""
    text = os.fspath(path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def _deadline(value: float | int | str, what: str) -> float:
    """A deadline: a finite duration greater than zero."""
    duration = seconds(value, what)
    if duration is None or not 0 < duration < math.inf:
        raise ValueError(f"{what} must be a finite duration greater than zero, not {value!r}")
    return duration


def _count(value: Any, what: str, least: int) -> int:
    """An integer of at least ``least`` (``True`` is no count)."""
    if type(value) is not int or value < least:
        wanted = "a positive integer" if least == 1 else f"{least} or more"
        raise ValueError(f"{what} must be {wanted}, not {value!r}")
    return value


def _place(value: str | os.PathLike[str] | None) -> str | None:
    return location(value) if value is not None else None


@dataclass(frozen=True)
class Settings:
    """The checked settings of one :class:`~cutline.api.StreamEnvironment` (each argument is
    described there). Durations are seconds; places are absolute paths or URLs."""

    parallelism: int
    max_parallelism: int
    checkpoint_settings: CheckpointSettings
    checkpoint_dir: str | None
    checkpointing: str
    alignment_timeout: float | None
    state: StateConfig
    savepoint_dir: str | None
    restart_attempts: int
    restart_delay: float
    heartbeat_timeout: float
    start_timeout: float
    restore_timeout: float
    commit_timeout: float
    slot_timeout: float
    on_host_loss: str
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
        if a["state_backend"] not in BACKENDS:
            raise ValueError(
                f"state_backend must be one of {', '.join(map(repr, BACKENDS))}, "
                f"not {a['state_backend']!r}"
            )
        checkpointing, alignment_timeout = _checkpointing(a)
        slot_timeout = seconds(a["slot_timeout"], "slot_timeout")
        if slot_timeout is None or not 0 <= slot_timeout < math.inf:
            raise ValueError(f"slot_timeout must be a finite duration, not {a['slot_timeout']!r}")
        return cls(
            parallelism=parallelism,
            max_parallelism=a["max_parallelism"],
            checkpoint_settings=CheckpointSettings(
                interval=seconds(a["checkpoint_interval"], "checkpoint_interval"),
                timeout=seconds(a["checkpoint_timeout"], "checkpoint_timeout") or 0.0,
                min_pause=seconds(a["min_pause"], "min_pause") or 0.0,
                tolerable_failures=a["tolerable_failed_checkpoints"],
                retained=a["retained_checkpoints"],
                max_concurrent=a["max_concurrent_checkpoints"],
            ),
            checkpoint_dir=_place(a["checkpoint_dir"]),
            checkpointing=checkpointing,
            alignment_timeout=alignment_timeout,
            state=StateConfig(
                backend=a["state_backend"],
                incremental=a["incremental_checkpoints"],
                full_every=a["full_checkpoint_every"],
                local_dir=os.fspath(a["state_dir"]) if a["state_dir"] is not None else None,
                memory=a["state_memory"],
            ),
            savepoint_dir=_place(a["savepoint_dir"]),
            restart_attempts=_count(a["restart_attempts"], "restart_attempts", 0),
            restart_delay=seconds(a["restart_delay"], "restart_delay") or 0.0,
            heartbeat_timeout=_deadline(a["heartbeat_timeout"], "heartbeat_timeout"),
            start_timeout=_deadline(a["start_timeout"], "start_timeout"),
            restore_timeout=_deadline(a["restore_timeout"], "restore_timeout"),
            commit_timeout=_deadline(a["commit_timeout"], "commit_timeout"),
            slot_timeout=slot_timeout,
            on_host_loss=check_host_loss(a["on_host_loss"]),
            dead_letter_dir=_place(a["dead_letter_dir"]),
            batch_size=_count(a["batch_size"], "batch_size", 1),
            buffer_capacity=_count(a["buffer_capacity"], "buffer_capacity", 1),
            storage_options=a["storage_options"],
        )


def _checkpointing(a: Mapping[str, Any]) -> tuple[str, float | None]:
    """The barrier handling and its alignment timeout, which fit together and with
    ``max_concurrent_checkpoints``."""
    mode, concurrent = a["checkpointing"], a["max_concurrent_checkpoints"]
    if mode not in CHECKPOINTING_MODES:
        raise ValueError(
            f"checkpointing must be one of {', '.join(map(repr, CHECKPOINTING_MODES))}, "
            f"not {mode!r}"
        )
    _count(concurrent, "max_concurrent_checkpoints", 1)
    timeout = seconds(a["alignment_timeout"], "alignment_timeout")
    if timeout is not None:
        if not math.isfinite(timeout):
            raise ValueError(
                f"alignment_timeout must be a finite duration, not {a['alignment_timeout']!r}"
            )
        if mode != "aligned":
            raise ValueError(f"alignment_timeout applies to aligned checkpoints only, not {mode!r}")
        if timeout < 0:
            raise ValueError(f"alignment_timeout must be 0 or more, not {a['alignment_timeout']!r}")
    if mode == "unaligned" and concurrent != 1:
        raise ValueError(
            "unaligned checkpoints are taken one at a time: max_concurrent_checkpoints must "
            f"be 1, not {concurrent!r}"
        )
    if timeout is not None and concurrent != 1:
        # (as in Flink: a barrier that goes unaligned overtakes the barriers of the
        # checkpoints queued before it, which could then never complete)
        raise ValueError(
            "with an alignment_timeout checkpoints may go unaligned, and those are taken one "
            f"at a time: max_concurrent_checkpoints must be 1, not {concurrent!r}"
        )
    return mode, timeout
