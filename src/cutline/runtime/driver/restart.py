"""When a failed job starts again: the restart strategy (Flink's fixed-delay strategy).

After an attempt failed, the job restarts from its latest complete checkpoint, after
``delay`` seconds, at most ``attempts`` times in a run; then it fails for good. A job whose
checkpoint directory another job took over (cause ``lock``) never restarts: two jobs must
not write one directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutline.runtime.driver.result import Failure


@dataclass(frozen=True)
class RestartStrategy:
    attempts: int = 3
    """Restarts allowed in one run (0: the first failure fails the job)."""
    delay: float = 1.0
    """Seconds between a failure and the restart."""

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 0:
            raise ValueError(f"restart_attempts must be an int >= 0, not {self.attempts!r}")
        if type(self.delay) not in (int, float) or not self.delay >= 0:
            raise ValueError(f"restart_delay must be a number of seconds >= 0, not {self.delay!r}")

    def restarts(self, failure: Failure, restarted: int) -> bool:
        """Whether the job restarts after ``failure``, having restarted ``restarted`` times."""
        return failure.cause != "lock" and restarted < self.attempts
