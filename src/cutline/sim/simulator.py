"""A deterministic, seeded discrete-event simulator that drives the protocol recorders.

Time moves in whole steps. Within a step the script's events come first, in
file order, then the deliveries due at that step in the order they were
scheduled. Every message takes a random delay of ``min_delay`` to
``max_delay`` steps, and every channel stays FIFO: a message is never
delivered before one sent earlier on the same channel.

Markers never change when a payment arrives. Payment delays come from one
random stream and marker delays from another, and a payment's delivery time
depends only on the payments before it; a marker that would arrive after a
payment sent later on its channel is delivered just before that payment
instead. So a run with snapshots delivers every payment at the same step, in
the same order, as the same run without them (the checker's
*non-interference* property), and the same seed always gives the same run.
"""

from __future__ import annotations

import gc
import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cutline.protocol import (
    Action,
    ChandyLamportRecorder,
    ChannelRecorded,
    RecordMessage,
    RecordState,
    SendMarker,
    SnapshotComplete,
)
from cutline.sim.log import EventKind, LogEvent, Payment, RecordedSnapshot, SimRun
from cutline.sim.scenario import Channel, Initiate, Scenario, ScenarioError, Send

Recorder = ChandyLamportRecorder[Channel, Payment]
RecorderFactory = Callable[[str, Sequence[Channel], Sequence[Channel]], Recorder]


def default_recorder(name: str, inputs: Sequence[Channel], outputs: Sequence[Channel]) -> Recorder:
    return ChandyLamportRecorder(inputs, outputs, name=name)


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


class _InFlight:
    """A payment or a marker travelling on a channel."""

    __slots__ = ("due", "payment", "seq", "snapshot")

    def __init__(self, due: int, seq: int, payment: Payment | None, snapshot: int | None) -> None:
        self.due = due
        self.seq = seq
        self.payment = payment
        self.snapshot = snapshot


class _Link:
    """The simulator's side of one channel: what is in flight on it, in FIFO order."""

    __slots__ = ("channel", "index", "last_payment_due", "queue")

    def __init__(self, channel: Channel, index: int) -> None:
        self.channel = channel
        self.index = index
        self.queue: deque[_InFlight] = deque()
        self.last_payment_due = 0


@dataclass(frozen=True)
class SimConfig:
    """How a run is simulated."""

    seed: int = 0
    min_delay: int = 1
    max_delay: int = 5
    snapshots: bool = True
    """With ``False`` the script's snapshot events are skipped (the baseline run)."""
    keep_log: bool = True
    """With ``False`` no event log is kept (for benchmarks); the checker needs the log."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_delay <= self.max_delay:
            raise ValueError(
                f"delays must satisfy 1 <= min_delay <= max_delay, got {self.min_delay}..{self.max_delay}"
            )


class BankProcess:
    """A process of the token-bank model: a balance, plus its snapshot recorder."""

    def __init__(self, sim: Simulator, pid: str, balance: int, recorder: Recorder) -> None:
        self.sim = sim
        self.pid = pid
        self.balance = balance
        self.recorder = recorder

    # events the simulator feeds in
    def initiate(self, snapshot_id: int) -> None:
        self.sim.log(EventKind.INITIATE, self.pid, snapshot=snapshot_id)
        actions = self.recorder.initiate(snapshot_id)
        if actions:  # empty when this process already recorded for that id
            self.sim.snapshot(snapshot_id).initiators.append(self.pid)
        self.apply(actions)

    def receive_marker(self, channel: Channel, snapshot_id: int) -> None:
        self.sim.log(EventKind.MARKER_DELIVER, self.pid, channel, snapshot=snapshot_id)
        self.apply(self.recorder.marker_received(snapshot_id, channel))

    def receive_payment(self, channel: Channel, payment: Payment) -> None:
        self.balance += payment.amount
        self.sim.log(
            EventKind.DELIVER, self.pid, channel, message=payment.id, amount=payment.amount
        )
        actions = self.recorder.message_received(channel, payment)
        if actions:
            self.apply(actions)

    def pay(self, dst: str, amount: int, line: int | None) -> None:
        if amount > self.balance:
            raise ScenarioError(
                self.sim.scenario.events_path,
                line,
                f"{self.pid} pays {_tokens(amount)} to {dst} but holds only "
                f"{_tokens(self.balance)} "
                f"at step {self.sim.now}",
            )
        self.balance -= amount
        self.sim.send_payment((self.pid, dst), amount)

    # carrying out the recorder's actions
    def apply(self, actions: Sequence[Action[Channel, Payment]]) -> None:
        sim = self.sim
        for action in actions:
            if isinstance(action, RecordMessage):
                sim.snapshot(action.snapshot_id).messages.append((action.channel, action.message))
            elif isinstance(action, SendMarker):
                sim.send_marker(action.channel, action.snapshot_id)
            elif isinstance(action, RecordState):
                sim.snapshot(action.snapshot_id).states[self.pid] = self.balance
                sim.log(
                    EventKind.RECORD, self.pid, snapshot=action.snapshot_id, amount=self.balance
                )
            elif isinstance(action, ChannelRecorded):
                sim.snapshot(action.snapshot_id).closed.append(action.channel)
                sim.log(
                    EventKind.CHANNEL_RECORDED,
                    self.pid,
                    action.channel,
                    snapshot=action.snapshot_id,
                )
            elif isinstance(action, SnapshotComplete):
                sim.snapshot(action.snapshot_id).completed.append(self.pid)
                sim.log(EventKind.COMPLETE, self.pid, snapshot=action.snapshot_id)
            else:  # pragma: no cover - the protocol has no other actions
                raise TypeError(f"unknown action {action!r}")


ProcessFactory = Callable[["Simulator", str, int, Recorder], BankProcess]


class Simulator:
    """Runs one scenario once. Use :func:`simulate` unless you need the pieces."""

    def __init__(
        self,
        scenario: Scenario,
        config: SimConfig | None = None,
        *,
        recorder_factory: RecorderFactory = default_recorder,
        process_factory: ProcessFactory = BankProcess,
    ) -> None:
        self.scenario = scenario
        self.config = config or SimConfig()
        topo = scenario.topology
        self.now = 0
        self._seq = 0
        self._payments = 0
        self._markers = 0
        self._delivered = 0
        # Two streams, so that markers never change a payment's delay. A delay is
        # min_delay + floor(u * span) for a uniform u: as uniform as randint, and cheaper.
        self._payment_random = random.Random(self.config.seed).random
        self._marker_random = random.Random(f"markers:{self.config.seed}").random
        self._delay_span = self.config.max_delay - self.config.min_delay + 1
        self._heap: list[tuple[int, int, int]] = []
        self._links = [_Link(c, i) for i, c in enumerate(topo.channels)]
        self._link_of = {link.channel: link for link in self._links}
        self._log: list[LogEvent] = []
        self._keep_log = self.config.keep_log
        self._snapshots: dict[int, RecordedSnapshot] = {}
        inputs: dict[str, list[Channel]] = {p: [] for p in topo.processes}
        outputs: dict[str, list[Channel]] = {p: [] for p in topo.processes}
        for channel in topo.channels:
            outputs[channel[0]].append(channel)
            inputs[channel[1]].append(channel)
        self.processes = {
            p: process_factory(
                self, p, topo.balances[p], recorder_factory(p, inputs[p], outputs[p])
            )
            for p in topo.processes
        }

    # --------------------------------------------------------------- services

    def log(
        self,
        kind: EventKind,
        process: str,
        channel: Channel | None = None,
        *,
        snapshot: int | None = None,
        message: int | None = None,
        amount: int | None = None,
    ) -> None:
        if self._keep_log:
            self._log.append(LogEvent(self.now, kind, process, channel, snapshot, message, amount))

    def snapshot(self, snapshot_id: int) -> RecordedSnapshot:
        snap = self._snapshots.get(snapshot_id)
        if snap is None:
            snap = RecordedSnapshot(snapshot_id, self.scenario.topology.processes)
            self._snapshots[snapshot_id] = snap
        return snap

    def send_payment(self, channel: Channel, amount: int) -> None:
        link = self._link_of[channel]
        payment = Payment(self._payments, amount)
        self._payments += 1
        self.log(EventKind.SEND, channel[0], channel, message=payment.id, amount=amount)
        cfg = self.config
        due = max(
            self.now + cfg.min_delay + int(self._payment_random() * self._delay_span),
            link.last_payment_due,
        )
        link.last_payment_due = due
        queue = link.queue
        # A marker must not hold a later payment back: pull trailing markers
        # that would arrive after this payment forward to its step.
        i = len(queue) - 1
        while i >= 0 and queue[i].payment is None and queue[i].due > due:
            marker = queue[i]
            marker.due = due
            heapq.heappush(self._heap, (due, marker.seq, link.index))
            i -= 1
        self._enqueue(link, due, payment, None)

    def send_marker(self, channel: Channel, snapshot_id: int) -> None:
        link = self._link_of[channel]
        self._markers += 1
        self.log(EventKind.MARKER_SEND, channel[0], channel, snapshot=snapshot_id)
        cfg = self.config
        due = self.now + cfg.min_delay + int(self._marker_random() * self._delay_span)
        if link.queue:
            due = max(due, link.queue[-1].due)
        self._enqueue(link, due, None, snapshot_id)

    def _enqueue(
        self, link: _Link, due: int, payment: Payment | None, snapshot: int | None
    ) -> None:
        seq = self._seq
        self._seq += 1
        link.queue.append(_InFlight(due, seq, payment, snapshot))
        heapq.heappush(self._heap, (due, seq, link.index))

    # ------------------------------------------------------------------ run

    def _deliver_through(self, limit: float) -> None:
        heap, links, processes = self._heap, self._links, self.processes
        while heap and heap[0][0] <= limit:
            due, seq, index = heapq.heappop(heap)
            queue = links[index].queue
            if not queue:
                continue
            head = queue[0]
            if head.seq != seq or head.due != due:
                continue  # a stale entry of a marker that was pulled forward
            queue.popleft()
            self.now = due
            self._delivered += 1
            channel = links[index].channel
            if head.payment is not None:
                processes[channel[1]].receive_payment(channel, head.payment)
            else:
                processes[channel[1]].receive_marker(channel, head.snapshot)  # type: ignore[arg-type]

    def run(self) -> SimRun:
        """Carry out the script, then deliver everything still in flight.

        The cyclic garbage collector is paused while the run goes on: a run
        allocates hundreds of thousands of small objects and creates no
        reference cycles (reference counting frees what it drops), and the
        collector's passes over them cost a third of a run's time.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if was_enabled:
                gc.enable()

    def _run(self) -> SimRun:
        snapshots = self.config.snapshots
        step = 0
        for event in self.scenario.events:
            self.now = step
            if isinstance(event, Send):
                self.processes[event.src].pay(event.dst, event.amount, event.line)
            elif isinstance(event, Initiate):
                if snapshots:
                    self.processes[event.process].initiate(event.snapshot_id)
            else:
                self._deliver_through(step + event.steps - 1)
                step += event.steps
        self.now = step
        self._deliver_through(float("inf"))
        if snapshots:
            for snapshot_id in self.scenario.snapshot_ids:
                self.snapshot(snapshot_id)
        return SimRun(
            scenario=self.scenario,
            seed=self.config.seed,
            snapshots_enabled=snapshots,
            log=self._log,
            snapshots=dict(sorted(self._snapshots.items())),
            final_balances={p: proc.balance for p, proc in self.processes.items()},
            end_time=self.now,
            log_kept=self._keep_log,
            stats={
                "payments": self._payments,
                "markers": self._markers,
                "deliveries": self._delivered,
            },
        )


def simulate(
    scenario: Scenario,
    config: SimConfig | None = None,
    *,
    recorder_factory: RecorderFactory = default_recorder,
    process_factory: ProcessFactory = BankProcess,
) -> SimRun:
    """Run ``scenario`` once and return its log and snapshots."""
    return Simulator(
        scenario, config, recorder_factory=recorder_factory, process_factory=process_factory
    ).run()
