"""Why an attempt fails: the failure detector of one generation of the job.

Every phase of a slot has a deadline, and every slot a heartbeat, so nothing waits for ever:

==================  =====================================================================
what                fails the attempt when
==================  =====================================================================
start               a slot has not reached the driver ``Timeouts.start`` after the launch
rendezvous          a slot is still exchanging addresses ``Timeouts.start`` after the last
                    slot arrived
restore             a slot has not reported running ``Timeouts.restore`` after its restore
                    began
running             a slot's heartbeats stopped for ``Timeouts.heartbeat`` (in any phase)
commit              a slot has not published and ended ``Timeouts.commit`` after the final
                    checkpoint completed
a subtask failed    at once (``task``), with its operator, record and traceback
a slot was lost     at once (``lost``); but a failure *caused* by another (a channel whose
                    upstream died) waits up to two seconds for the cause's own report,
                    which wins
==================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from cutline.runtime.driver.config import JobConfig
from cutline.runtime.driver.result import Failure
from cutline.runtime.network.messages import Failed

CONSEQUENCE_WAIT = 2.0
"""Seconds a failure caused by another (a broken channel) waits for the cause's report."""


class FailureDetector:
    """The slots of one attempt: the phase each is in, when each was last heard of, and the
    failure that ends the attempt (:attr:`failure`, the first cause found).

    :param host_of: where a slot runs (``None``: not known yet), for the messages.
    """

    def __init__(
        self,
        slots: frozenset[str],
        config: JobConfig,
        host_of: Callable[[str], str | None],
    ) -> None:
        self._slots, self._config = slots, config
        self.launched = 0.0
        """When the slots were launched (the start deadline counts from then)."""
        self._host_of = host_of
        self.phases: dict[str, tuple[str, float]] = {}
        """Slot -> the phase it is in (``rendezvous``, ``restore``, ``running``) and since
        when: every phase has a deadline."""
        self._last_beat: dict[str, float] = {}
        self.committing: tuple[int, float] | None = None
        """The final checkpoint, and when it completed: the slots publish and end."""
        self.failure: Failure | None = None
        self._consequence: Failure | None = None
        """A failure caused by another (a channel whose upstream died), used if no cause
        comes."""
        self._consequence_at = 0.0

    def heard(self, slot: str, now: float) -> None:
        """Any message from ``slot`` (heartbeats go in every phase)."""
        self._last_beat[slot] = now

    def entered(self, slot: str, phase: str, now: float) -> None:
        self.phases[slot] = (phase, now)

    def fail(self, failure: Failure) -> None:
        """The attempt fails for ``failure`` (unless it failed already)."""
        if self.failure is None:
            self.failure = failure

    def task_failed(self, message: Failed, now: float) -> None:
        """A subtask reported its failure: the cause, unless it is only a consequence of
        another slot's (a broken channel: that slot's report, or its loss, is the cause)."""
        if message.cause == "channel":
            if self._consequence is None:
                self._consequence = Failure("lost", message.error, subtask=message.subtask)
                self._consequence_at = now
        elif self.failure is None or self.failure.cause != "task":
            self.failure = Failure(
                "task",
                message.error,
                subtask=message.subtask,
                operator=message.operator,
                record=message.record,
                traceback=message.traceback,
                passing=message.passing,
            )

    def lost(self, slot: str, reason: str, finished: bool) -> None:
        """The connection of ``slot`` ended early (a killed worker, a broken connection)."""
        if not finished and self.failure is None:
            self.failure = Failure(
                "lost",
                f"lost{self.on_host(slot)}: {reason} (the worker process or its host died, or "
                "its connection broke)",
                subtask=slot,
            )

    def launcher_failed(self, error: str) -> Failure:
        """Why the attempt failed when its launcher did: a slot's report if one came (it
        names the operator), else the consequence, else the launcher's error."""
        return self.failure or self._consequence or Failure("launcher", error)

    def check(self, now: float, finished: set[str], final: int | None) -> Failure | None:
        """The failure that ends the attempt now, if any: one reported, a consequence whose
        cause never came, a slot that stopped answering, or a phase past its deadline."""
        if self.failure is not None:
            return self.failure
        if self._consequence is not None and now - self._consequence_at > CONSEQUENCE_WAIT:
            return self._consequence
        return self._late(now, finished, final)

    def _late(self, now: float, finished: set[str], final: int | None) -> Failure | None:
        deadlines = self._config.deadlines
        for slot in sorted(set(self.phases) - finished):
            if now - self._last_beat.get(slot, now) > deadlines.heartbeat:
                return Failure(
                    "lost",
                    f"stopped answering (no heartbeat for {deadlines.heartbeat:g} s, "
                    f"{self._phase_text(slot, final)}){self.on_host(slot)}",
                    subtask=slot,
                )
        absent = sorted(self._slots - set(self.phases))
        if absent and now - self.launched > deadlines.start:
            return Failure(
                "deadline",
                f"{slots_text(absent)} did not start within {deadlines.start:g} s "
                "(Timeouts.start): Spark did not run the task, or its Python worker stopped "
                "before it reached the driver",
            )
        if absent:
            return None
        last_arrival = max(since for _, since in self.phases.values())
        meeting = sorted(s for s, (phase, _) in self.phases.items() if phase == "rendezvous")
        if meeting and now - last_arrival > deadlines.start:
            return Failure(
                "deadline",
                f"{slots_text(meeting)} did not finish the rendezvous (exchanging addresses with "
                f"the other slots) within {deadlines.start:g} s (Timeouts.start)",
            )
        for slot, (phase, since) in sorted(self.phases.items()):
            if phase == "restore" and now - since > deadlines.restore:
                return Failure(
                    "deadline",
                    f"did not report running within {deadlines.restore:g} s of starting "
                    "its restore (Timeouts.restore): restoring its state, opening its operators "
                    f"or connecting its outputs took longer{self.on_host(slot)}",
                    subtask=slot,
                )
        if self.committing is not None:
            checkpoint, since = self.committing
            ending = sorted(self._slots - finished)
            if ending and now - since > deadlines.commit:
                return Failure(
                    "deadline",
                    f"{slots_text(ending)} did not publish and end within "
                    f"{deadlines.commit:g} s of the final checkpoint {checkpoint}'s "
                    "completion (Timeouts.commit)",
                )
        return None

    def _phase_text(self, slot: str, final: int | None) -> str:
        phase, _ = self.phases.get(slot, ("start", 0.0))
        if phase == "running" and self.committing is not None:
            return "while publishing after the final checkpoint"
        if phase == "running" and final is not None:
            return "during the final checkpoint"
        return {
            "rendezvous": "during the rendezvous",
            "restore": "while restoring its state",
            "running": "while running",
        }.get(phase, f"in phase {phase}")

    def on_host(self, slot: str) -> str:
        host = self._host_of(slot)
        return f" (on {host})" if host else ""


def slots_text(slots: list[str]) -> str:
    """``slot-1``, ``slot-0 and slot-1``, ``slot-0, slot-1 and slot-2``."""
    return slots[0] if len(slots) == 1 else f"{', '.join(slots[:-1])} and {slots[-1]}"
