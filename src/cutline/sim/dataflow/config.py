"""What one run of the dataflow model (:mod:`cutline.sim.dataflow.model`) is given: the
checkpointing mode, the barrier handler each operator subtask gets for it, and how the run is
scheduled (:class:`DataflowConfig`: its seed, the buffers' capacities, the weights of the
rare steps against those that move records and barriers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from cutline.protocol import BarrierAligner, BarrierTracker
from cutline.sim.dataflow.graph import ChannelId

Mode: TypeAlias = Literal["aligned", "unaligned", "aligned_timeout", "at_least_once"]
MODES: tuple[Mode, ...] = ("aligned", "unaligned", "aligned_timeout", "at_least_once")
"""The checkpointing modes: the three exactly-once ones, then at-least-once."""

Handler: TypeAlias = BarrierAligner[ChannelId] | BarrierTracker[ChannelId]
HandlerFactory: TypeAlias = Callable[
    [str, Sequence[ChannelId], frozenset[ChannelId], Mode], Handler
]
"""``(subtask name, inputs, back edges, mode) -> handler``."""


def default_handler(
    name: str, inputs: Sequence[ChannelId], back_edges: frozenset[ChannelId], mode: Mode
) -> Handler:
    """The real handler for ``mode``."""
    if mode == "at_least_once":
        return BarrierTracker(inputs, back_edges=back_edges, name=name)
    return BarrierAligner(inputs, unaligned=mode == "unaligned", back_edges=back_edges, name=name)


@dataclass(frozen=True)
class DataflowConfig:
    """How one run is scheduled."""

    mode: Mode = "aligned"
    seed: int = 0
    buffer_capacity: int = 2
    """Records an output buffer holds (back edges: unbounded)."""
    input_capacity: int = 2
    """Records an input buffer holds."""
    max_checkpoints: int = 3
    trigger_weight: float = 0.05
    """Weight of the coordinator's trigger step against 1 for a record or barrier step."""
    timeout_weight: float = 0.1
    """Weight of each armed alignment timer (``aligned_timeout`` mode)."""
    trigger_timers: float = 0.0
    """``aligned_timeout`` mode: the chance that an operator subtask arms the timer of a
    checkpoint when it is triggered, rather than when its alignment blocks a channel."""
    abort_weight: float = 0.0
    """Weight of the coordinator aborting the oldest in-flight checkpoint."""
    notice_weight: float = 0.3
    """Weight of delivering each pending abort notice to its subtask."""
    census_weight: float = 0.2
    """Weight of the coordinator starting the next census wave of a loop."""
    count_weight: float = 0.5
    """Weight of each subtask of the loop answering the census wave (counting then)."""
    unaligned_sources: bool = True
    """In ``unaligned`` mode, sources also emit their barriers ahead of their output buffers."""
    max_steps: int = 200_000
    trace: bool = False
    """Keep a line per step in :attr:`DataflowRun.trace` (for debugging)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; one of {MODES}")
        if self.buffer_capacity < 1 or self.input_capacity < 1:
            raise ValueError("buffer capacities must be at least 1")
        weights = (
            self.trigger_weight,
            self.timeout_weight,
            self.notice_weight,
            self.census_weight,
            self.count_weight,
        )
        if min(weights) <= 0:
            raise ValueError(
                "the trigger, timeout, notice, census and count weights must be positive"
            )
        if self.abort_weight < 0:
            raise ValueError("abort_weight must not be negative")
        if not 0 <= self.trigger_timers <= 1:
            raise ValueError("trigger_timers is a probability")

    @property
    def exactly_once(self) -> bool:
        return self.mode != "at_least_once"
