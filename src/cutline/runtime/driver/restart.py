"""When a failed job starts again: the restart strategy (Flink's fixed-delay strategy).

After an attempt failed, the job restarts from its latest complete checkpoint, after
``delay`` seconds, at most ``attempts`` times in a run; then it fails for good. A job whose
checkpoint directory another job took over (cause ``lock``) never restarts: two jobs must
not write one directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutline.runtime.driver.result import Failure

HOST_LOSS_POLICIES = ("restart", "wait")
"""After a generation failed: ``restart`` at once on the slots there are (the hosts that remain,
when they have enough), or ``wait`` (up to ``slot_timeout``) for every host it ran on to be
back."""


@dataclass(frozen=True)
class RestartStrategy:
    attempts: int = 3
    """Restarts allowed in one run (0: the first failure fails the job)."""
    delay: float = 1.0
    """Seconds between a failure and the restart."""
    on_host_loss: str = "restart"
    """One of :data:`HOST_LOSS_POLICIES`."""

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 0:
            raise ValueError(f"restart_attempts must be 0 or more, not {self.attempts!r}")
        if type(self.delay) not in (int, float) or not self.delay >= 0:
            raise ValueError(f"restart_delay must be a number of seconds >= 0, not {self.delay!r}")
        if self.on_host_loss not in HOST_LOSS_POLICIES:
            raise ValueError(
                f"on_host_loss must be one of {', '.join(map(repr, HOST_LOSS_POLICIES))}, "
                f"not {self.on_host_loss!r}"
            )

    def restarts(self, failure: Failure, restarted: int) -> bool:
        """Whether the job restarts after ``failure``, having restarted ``restarted`` times."""
        return failure.cause != "lock" and restarted < self.attempts
