"""The backend a job's state settings choose: :func:`new_backend`."""

from __future__ import annotations

from typing import assert_never

from cutline.runtime.state.backend import KeyedStateBackend
from cutline.runtime.state.config import Backend, StateConfig
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM
from cutline.runtime.state.memory import MemoryStateBackend
from cutline.runtime.state.rocksdb import DiskStateBackend


def new_backend(
    config: StateConfig | None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    key_groups: range | None = None,
) -> KeyedStateBackend:
    """The backend ``config`` asks for."""
    config = config or StateConfig()
    cls: type[KeyedStateBackend]
    match config.backend:
        case Backend.MEMORY:
            cls = MemoryStateBackend
        case Backend.DISK:
            cls = DiskStateBackend
        case unknown:
            assert_never(unknown)
    return cls(max_parallelism, key_groups, config)
