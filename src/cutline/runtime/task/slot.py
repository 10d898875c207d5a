"""The slot: one Spark task of the job's barrier stage, running one subtask of every chain.

A slot

1. connects to the driver's control server first, and sends heartbeats from then on, from a
   thread of its own, in every phase; it says each phase it enters (``Phase``);
2. opens an :class:`~cutline.runtime.network.input_gate.InputGate` for each of its subtasks that
   has inputs, and exchanges the gates' addresses with the other slots once through the
   driver (the *rendezvous*: it sends ``Gates``, the driver answers every slot with ``Peers``
   once all said theirs);
3. starts each subtask's thread (a
   :class:`~cutline.runtime.task.source_subtask.SourceSubtask` or an
   :class:`~cutline.runtime.task.input_subtask.InputSubtask`), which restores its state from
   the checkpoint the driver chose and opens its operators: every call into an operator, a
   connector's reader or writer among them, is made on that thread, from the one that makes
   it to its ``close()``; then connects the output channels, and says ``Ready``;
4. lets the subtasks run their loops, routes the driver's messages to them and answers
   ``Census`` itself;
5. says ``Finished`` when every subtask ended, or reports the first failure and raises.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, assert_never

from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.network.channel import ChannelError
from cutline.runtime.network.control import ControlClient
from cutline.runtime.network.input_gate import InputGate
from cutline.runtime.network.messages import (
    Abort,
    Census,
    CensusCount,
    Complete,
    ControlError,
    Drain,
    Finished,
    Gates,
    Heartbeat,
    Peers,
    Phase,
    Ready,
    Release,
    Stop,
    Trigger,
)
from cutline.runtime.task.failures import failed_message
from cutline.runtime.task.input_subtask import InputSubtask
from cutline.runtime.task.launch import SlotSetup
from cutline.runtime.task.source_subtask import SourceSubtask
from cutline.runtime.task.subtask import JOIN_SECONDS, SubtaskRunner


def run_slot(setup: SlotSetup, slot: int, host: str) -> dict[str, Any]:
    """Run subtask ``slot`` of every chain of ``setup.plan``; return a summary when all ended.

    The slot reaches the driver first and sends heartbeats from then on, from a thread of its
    own, whatever phase it is in (a frozen process is noticed in any phase); it tells the
    driver each phase it enters (``phase``), so that the driver can hold each to a deadline."""
    plan = setup.plan
    gates: dict[str, InputGate] = {}
    control: ControlClient | None = None
    beats: _Heartbeats | None = None
    runners: list[SubtaskRunner] = []
    try:
        setup.enter("start", slot)
        control = ControlClient(
            setup.driver, f"slot-{slot}", token=setup.token, generation=setup.generation
        )
        beats = _Heartbeats(control, runners, setup.heartbeat_interval)
        control.send(Phase("rendezvous", pid=os.getpid(), host=host))
        setup.enter("rendezvous", slot)
        for chain in plan.chains:
            if not chain.is_source:
                gates[chain.uid] = InputGate(
                    plan.input_channels(chain, slot),
                    token=setup.token,
                    generation=setup.generation,
                    capacity=setup.buffer_capacity,
                    back_edges=plan.back_edge_channels(chain, slot),
                )
        control.send(Gates(host, {uid: gate.port for uid, gate in gates.items()}))
        peers = _peers(control)
        if peers is None:
            return {"stopped": True}
        addresses = {
            (other, uid): (peers.hosts[other], port)
            for other, ports in enumerate(peers.ports)
            for uid, port in ports.items()
        }
        control.send(Phase("restore"))
        setup.enter("restore", slot)
        storage = CheckpointStorage(setup.checkpoint_dir, storage_options=setup.storage_options)
        for chain in plan.chains:
            kind: type[SubtaskRunner] = SourceSubtask if chain.is_source else InputSubtask
            runners.append(kind(setup, chain, slot, control, storage, gates.get(chain.uid)))
        for runner in runners:  # each opens its operators on its own thread, which runs them
            runner.start()
        for runner in runners:
            runner.opened.wait()
            if runner.failure is not None:  # (reported by the subtask, naming its operator)
                raise RuntimeError(f"subtask {runner.name} failed: {runner.failure}")
        for runner in runners:
            runner.connect(addresses)
        control.send(Ready(os.getpid(), host))
        setup.enter("running", slot)
        return _supervise(setup, slot, control, runners)
    except BaseException as exc:
        if control is not None and not any(r.failure for r in runners):
            with contextlib.suppress(ControlError):
                control.send(failed_message(f"slot-{slot}", exc, "(starting the subtasks)"))
        raise
    finally:
        if beats is not None:
            beats.stop()
        for runner in runners:
            runner.stop()
            for channel in runner.outputs.channels():
                channel.close()
        for gate in gates.values():
            gate.close()
        if control is not None:
            control.close()
        # Let the subtask threads end before the slot does, so that none of them still
        # pre-commits or publishes while the next generation recovers (in a reused worker, or
        # with the thread launcher). A thread stuck in user code is given up on after a while.
        deadline = time.monotonic() + JOIN_SECONDS
        for runner in runners:
            if runner.thread is not None:
                runner.thread.join(max(0.0, deadline - time.monotonic()))
            else:
                runner.close_operators()  # opened (or half opened) but never ran
        for runner in runners:  # (queued writes were cancelled: one at most is in progress)
            runner.snapshot_writer.wait(deadline - time.monotonic())


def _peers(control: ControlClient) -> Peers | None:
    """The rendezvous' answer: every slot's gates (``None``: the driver stopped the attempt
    first). A driver that is gone ends the wait (:class:`ControlError`); one that hangs is
    the Spark task's to end, as the driver's deadline for the rendezvous cancels the stage."""
    while True:
        message = control.receive(timeout=1.0)
        match message:
            case None:
                continue
            case Peers():
                return message
            case Stop():
                return None
            case Trigger() | Complete() | Abort() | Drain() | Census() | Release():
                raise ControlError(f"the driver sent {message.kind!r} before the rendezvous ended")
            case _:
                assert_never(message)


class _Heartbeats:
    """The slot's heartbeats, from a thread of its own: from the moment the slot reached the
    driver, in every phase, with the subtasks' figures once they run."""

    def __init__(self, control: ControlClient, runners: list[SubtaskRunner], every: float):
        self._control, self._runners, self._every = control, runners, every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cutline-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            running = [r for r in list(self._runners) if r.looping]
            try:
                self._control.send(
                    Heartbeat({r.name: r.records_in for r in running}, _metrics(running))
                )
            except ControlError:
                return  # the driver is gone: the slot's loop notices it too

    def stop(self) -> None:
        self._stopped.set()


_CONSEQUENCE_WAIT = 30.0
"""Seconds a slot whose subtasks failed only because another slot's did (a broken channel)
keeps its control connection open, so that the driver hears the cause first."""


def _supervise(
    setup: SlotSetup, slot: int, control: ControlClient, runners: list[SubtaskRunner]
) -> dict[str, Any]:
    threads = []
    for runner in runners:
        assert runner.thread is not None
        threads.append(runner.thread)
        runner.go()
    final: int | None = None
    while any(t.is_alive() for t in threads):
        failed = [r for r in runners if r.failure is not None]
        if failed:
            _failed(control, failed)
        try:
            message = control.receive(timeout=0.1)
        except ControlError:
            raise RuntimeError("the driver closed the control connection") from None
        match message:
            case None:
                pass
            case Census(wave=wave):
                # counted here, after the request came: the driver's waves need that order
                sent = sum(r.records_sent for r in runners)
                control.send(CensusCount(wave, sent, sum(r.records_done for r in runners)))
            case Trigger() | Complete() | Abort() | Stop() | Drain() | Release():
                if isinstance(message, Trigger) and message.final:
                    final = message.checkpoint
                    setup.enter("final_checkpoint", slot)
                elif isinstance(message, Complete) and message.checkpoint == final:
                    setup.enter("commit", slot)
                for runner in runners:
                    runner.inbox.put(message)
            case Peers():
                raise ControlError("the driver sent 'peers' after the rendezvous")
            case _:
                assert_never(message)
    failed = [r for r in runners if r.failure is not None]
    if failed:
        _failed(control, failed)
    if any(r.stopped.is_set() for r in runners):
        return {"stopped": True}
    records_in = {r.name: r.records_in for r in runners}
    control.send(Finished(records_in, _metrics(runners)))
    return {"records_in": records_in}


def _failed(control: ControlClient, failed: list[SubtaskRunner]) -> None:
    """End the slot for its failed subtasks. When every one of them failed only because
    another slot's did (a channel whose upstream went away), the cause is that slot's: keep
    this connection open until the driver ends the attempt (up to :data:`_CONSEQUENCE_WAIT`),
    so that the driver hears the cause before it hears of this slot."""
    cause = next((r for r in failed if not isinstance(r.failure, ChannelError)), failed[0])
    if isinstance(cause.failure, ChannelError):
        deadline = time.monotonic() + _CONSEQUENCE_WAIT
        with contextlib.suppress(ControlError):
            while time.monotonic() < deadline:
                control.receive(timeout=0.1)
    raise RuntimeError(f"subtask {cause.name} failed: {cause.failure}")


def _metrics(runners: list[SubtaskRunner]) -> dict[str, Any]:
    """The live figures of a heartbeat (``runtime/metrics.py``)."""
    return {
        r.name: {
            "ops": r.operator_records,
            "backpressured": round(r.backpressured, 4),
            "watermark": r.shown_watermark,
            "event_time": r.event_figures(),
            "dead_letters": r.dead_letter_count(),
        }
        for r in runners
    }
