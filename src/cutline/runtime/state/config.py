"""The state settings: :class:`StateConfig`, validated when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Backend(StrEnum):
    """Where keyed state lives: ``state_backend="memory"`` or ``"disk"`` as the user names it,
    this once the settings are made (see :mod:`~cutline.runtime.state.backend`)."""

    MEMORY = "memory"
    """Python dicts (:class:`~cutline.runtime.state.memory.MemoryStateBackend`)."""
    DISK = "disk"
    """An embedded RocksDB on the worker's disk
    (:class:`~cutline.runtime.state.rocksdb.DiskStateBackend`)."""


BACKENDS = tuple(Backend)


@dataclass(frozen=True)
class StateConfig:
    """How a job keeps and checkpoints its keyed state.

    :param backend: ``"memory"`` or ``"disk"`` (see the module's docstring).
    :param incremental: checkpoints write only what changed since the last complete one.
    :param full_every: with ``incremental``: a chain of segments is at most this long (one full
        and ``full_every - 1`` incremental ones), so a restore never reads an endless chain
        and old files can be deleted.
    :param local_dir: ``"disk"``: where the working databases live on each worker (default:
        the system's temporary directory). They are scratch space: checkpoints are what
        survives.
    :param memory: ``"disk"``: bytes of memory for RocksDB's write buffers and block cache,
        per keyed operator subtask; a window operator's runs
        (:mod:`~cutline.runtime.eventtime.run_windows`) and a join's rows
        (:mod:`~cutline.runtime.joins.chunks`) are written to files beyond half of it.
    """

    backend: Backend = Backend.MEMORY
    """(Given as its name, ``"memory"`` or ``"disk"``, it is made the :class:`Backend`.)"""
    incremental: bool = True
    full_every: int = 10
    local_dir: str | None = None
    memory: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            try:
                object.__setattr__(self, "backend", Backend(self.backend))
            except ValueError:
                raise ValueError(
                    f"state_backend must be one of {', '.join(repr(str(b)) for b in Backend)}, "
                    f"not {self.backend!r}"
                ) from None
        if type(self.incremental) is not bool:
            raise ValueError(
                f"incremental_checkpoints must be True or False, not {self.incremental!r}"
            )
        if type(self.full_every) is not int or self.full_every < 1:
            raise ValueError(
                f"full_checkpoint_every must be a positive integer, not {self.full_every!r}"
            )
        if type(self.memory) is not int or self.memory < 1024 * 1024:
            raise ValueError(
                f"state_memory must be at least 1 MiB (1048576 bytes), not {self.memory!r}"
            )
