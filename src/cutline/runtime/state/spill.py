"""Arrow files an operator subtask writes its state to when it holds more than its memory
allows, mapped back (:class:`SpillFiles`): what the disk backend's window runs
(:mod:`~cutline.runtime.eventtime.run_windows`) and join rows
(:mod:`~cutline.runtime.joins.rows`) are written to beyond their share of
``StateConfig.memory``.

A spill writes batches of one schema, all at once, into one new Arrow IPC file of the
subtask's own folder (the disk backend's :attr:`~cutline.runtime.state.backend.
KeyedStateBackend.path`, removed with the backend), and maps the file back: the batches it
returns are read from the mapping (zero-copy), and the operating system pages them in and
out as they are read. The holder says when it lets go of a batch (:meth:`SpillFiles.release`);
a file is removed once none of its batches is held. A snapshot being written that still reads
a batch of a removed file is unharmed: the mapping outlives the name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence

import pyarrow as pa


class SpillFiles:
    """The spill files of one holder, in ``folder``, named ``<prefix>-<n>.arrow``.

    :param folder: the subtask's own folder (it exists).
    :param prefix: what the files' names begin with (unique among the folder's holders).
    """

    def __init__(self, folder: str, prefix: str) -> None:
        self.folder = folder
        self.prefix = prefix
        self.spills = 0
        """How many files were written."""
        self._numbers = itertools.count()
        self._live: dict[str, int] = {}
        """Per file, how many of its batches are held."""

    @property
    def paths(self) -> list[str]:
        """The files not removed yet."""
        return list(self._live)

    def write(self, batches: Sequence[pa.RecordBatch]) -> tuple[str, list[pa.RecordBatch]]:
        """Write ``batches`` (at least one, of one schema) into a new file and map it back:
        its path, and the batches as read from the mapping (each held until
        :meth:`release` d)."""
        assert batches, "a spill writes at least one batch"
        path = os.path.join(self.folder, f"{self.prefix}-{next(self._numbers)}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            mapped = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self._live[path] = len(mapped)
        self.spills += 1
        return path, mapped

    def release(self, path: str, count: int = 1) -> None:
        """``count`` batches of ``path`` are not held any more: the file is removed once none
        is (a path not of these files is ignored)."""
        if path not in self._live:
            return
        self._live[path] -= count
        if self._live[path] <= 0:
            del self._live[path]
            with contextlib.suppress(OSError):
                os.remove(path)
