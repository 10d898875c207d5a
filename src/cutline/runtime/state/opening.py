"""A keyed operator's state backend, opened for its subtask's key groups and restored:
:func:`open_keyed_state`, what every keyed operator (a process function, a rolling
aggregation, a window operator) does first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cutline.runtime.state.backend import KeyedStateBackend
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.factory import new_backend
from cutline.runtime.state.keygroups import StateError, key_group_range
from cutline.runtime.state.segments import SegmentSource


def open_keyed_state(
    config: StateConfig,
    subtask: int,
    parallelism: int,
    max_parallelism: int,
    state: Any,
    store: SegmentSource | None,
    checkpoint: int | None,
) -> tuple[KeyedStateBackend, list[Mapping[str, Any]]]:
    """The backend ``config`` asks for, owning subtask ``subtask``'s key groups (of
    ``parallelism`` subtasks), restored from ``state`` (a keyed state handle, a list of them,
    or nothing) read from ``store`` (``checkpoint``: the restored checkpoint, when later
    incremental checkpoints may build on its files); and the handles it was restored from
    (what their ``extra`` kept). A backend that fails to restore is closed."""
    groups = key_group_range(subtask, parallelism, max_parallelism)
    backend = new_backend(config, max_parallelism, groups)
    if not state:
        return backend, []
    try:
        if store is None:
            raise StateError("keyed state to restore, but nowhere to read it from")
        handles = state if isinstance(state, list) else [state]
        backend.restore(handles, store, checkpoint_id=checkpoint)
    except BaseException:
        backend.close()  # (the disk backend's working database goes)
        raise
    return backend, handles
