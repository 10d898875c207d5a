"""Channels over real TCP sockets: order, alignment blocking, backpressure, refusals, failures."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pyarrow as pa
import pytest

from cutline.protocol import BarrierAligner
from cutline.runtime.network.channel import ChannelError, PriorityBarrier
from cutline.runtime.network.input_gate import InputGate
from cutline.runtime.network.output_channel import OutputChannel
from cutline.runtime.network.wire import Barrier, EndOfInput, Hello, Records, encode, encode_credit

TOKEN = b"job-token"
WAIT = 30.0  # seconds: only a bound against a hang, never an expectation


def address(gate: InputGate) -> tuple[str, int]:
    return ("127.0.0.1", gate.port)


def drain(gate: InputGate, blocked: set[str] | None = None) -> list[tuple[str, object]]:
    out = []
    while (item := gate.poll(blocked or set(), timeout=WAIT)) is not None:
        channel, frame = item
        out.append((channel, frame))
    return out


def test_frames_arrive_in_order_per_channel_and_every_channel_ends() -> None:
    # room for every frame: nothing polls until all are sent
    with InputGate(["a", "b"], token=TOKEN, generation=1, capacity=64) as gate:
        senders = [OutputChannel(address(gate), c, token=TOKEN, generation=1) for c in ("a", "b")]
        for k in range(50):
            for s in senders:
                s.send(Records([f"{s.channel}{k}"]))
            if k == 20:
                for s in senders:
                    s.send(Barrier(1))
        for s in senders:
            s.send(EndOfInput())
            s.close()
        got = drain(gate)
        assert gate.finished
    for name in ("a", "b"):
        frames = [f for c, f in got if c == name]
        expected = [Records([f"{name}{k}"]) for k in range(21)] + [Barrier(1)]
        expected += [Records([f"{name}{k}"]) for k in range(21, 50)] + [EndOfInput()]
        assert frames == expected


def test_a_blocked_channel_waits_while_the_others_flow() -> None:
    with InputGate(["a", "b"], token=TOKEN, generation=0, capacity=4) as gate:
        a = OutputChannel(address(gate), "a", token=TOKEN, generation=0)
        b = OutputChannel(address(gate), "b", token=TOKEN, generation=0)
        a.send(Barrier(7))
        a.send(Records(["after the barrier"]))
        assert gate.poll(timeout=WAIT) == ("a", Barrier(7))
        for k in range(3):
            b.send(Records([k]))
        b.send(Barrier(7))
        # a is blocked (aligning checkpoint 7): only b's frames come, up to its barrier
        got = [gate.poll({"a"}, timeout=WAIT) for _ in range(4)]
        assert got == [
            ("b", Records([0])),
            ("b", Records([1])),
            ("b", Records([2])),
            ("b", Barrier(7)),
        ]
        assert gate.poll({"a", "b"}, timeout=0.05) is None  # everything left is blocked
        assert gate.buffered("a") == 1
        assert gate.poll(set(), timeout=WAIT) == ("a", Records(["after the barrier"]))
        a.close()
        b.close()


def test_a_slow_consumer_blocks_its_sender_and_memory_stays_bounded() -> None:
    frame = Records(pa.record_batch({"x": pa.array(bytes(1024) for _ in range(1024))}))
    total = 64  # 64 frames of 1 MiB: far more than the socket buffers hold
    sent = 0
    done = threading.Event()
    with InputGate(["a"], token=TOKEN, generation=0, capacity=2) as gate:

        def produce() -> None:
            nonlocal sent
            with OutputChannel(address(gate), "a", token=TOKEN, generation=0) as out:
                for _ in range(total):
                    out.send(frame)
                    sent += 1
                out.send(EndOfInput())
            done.set()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        # nothing is polled yet: the queue fills to its capacity and no further
        deadline = time.monotonic() + WAIT
        while gate.buffered("a") < 2:
            assert time.monotonic() < deadline, "the queue never filled"
            threading.Event().wait(0.01)
        assert gate.buffered("a") == 2
        assert not done.is_set()
        assert sent < total  # the sender is held back by TCP, not buffered without bound
        received = drain(gate)
        producer.join(WAIT)
        assert done.is_set()
    assert len(received) == total + 1
    assert all(f == frame for _, f in received[:-1])


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        (Hello("a", 1, b"another job"), "token is not this job's"),
        (Hello("a", 0, TOKEN), "generation 0 of the job, this is generation 1"),
        (Hello("zzz", 1, TOKEN), "'zzz' is not an input here"),
    ],
)
def test_foreign_and_stale_connections_are_refused_and_the_real_one_works(
    hello: Hello, reason: str
) -> None:
    with InputGate(["a"], token=TOKEN, generation=1) as gate:
        intruder = socket.create_connection(address(gate))
        intruder.sendall(encode(hello) + encode(Records(["must never be read"])))
        assert intruder.recv(10) == b""  # closed by the gate
        intruder.close()
        with OutputChannel(address(gate), "a", token=TOKEN, generation=1) as real:
            real.send(Records(["ok"]))
            real.send(EndOfInput())
        assert drain(gate) == [("a", Records(["ok"])), ("a", EndOfInput())]
        assert any(reason in r for r in gate.refused)


def test_an_upstream_that_disconnects_early_fails_the_channel() -> None:
    with InputGate(["a", "b"], token=TOKEN, generation=0) as gate:
        a = OutputChannel(address(gate), "a", token=TOKEN, generation=0)
        a.send(Records([1]))
        a.close()  # no end of input: the upstream subtask died
        with pytest.raises(ChannelError, match="'a': the upstream subtask disconnected before"):
            for _ in range(3):
                gate.poll(timeout=WAIT)


def test_garbage_on_a_channel_fails_it_with_the_reason() -> None:
    with InputGate(["a"], token=TOKEN, generation=0) as gate:
        conn = socket.create_connection(address(gate))
        conn.sendall(encode(Hello("a", 0, TOKEN)) + b"\x03\x00\x00\x00\x00\x01!")
        with pytest.raises(
            ChannelError, match="'a': a barrier frame must hold a checkpoint id and its base"
        ):
            gate.poll(timeout=WAIT)
        conn.close()


def test_connecting_to_nobody_names_the_address() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ChannelError, match=f"cannot connect to 127.0.0.1:{port}"):
        OutputChannel(("127.0.0.1", port), "a", token=TOKEN, generation=0, connect_timeout=5)


def test_bytes_that_are_not_a_channel_do_not_fail_the_gate() -> None:
    with InputGate(["a"], token=TOKEN, generation=0) as gate:
        probe = socket.create_connection(address(gate))
        probe.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a health check, a scanner
        assert probe.recv(10) == b""
        probe.close()
        with OutputChannel(address(gate), "a", token=TOKEN, generation=0) as real:
            real.send(EndOfInput())
        assert drain(gate) == [("a", EndOfInput())]
        assert any("does not start like a cutline channel" in r for r in gate.refused)


def test_a_peer_may_not_make_the_gate_buffer_much_before_its_hello() -> None:
    with InputGate(["a"], token=TOKEN, generation=0) as gate:
        probe = socket.create_connection(address(gate))
        # a header announcing a 200 MB hello: refused at once, nothing buffered
        probe.sendall(b"CUTL\x01\x01\x00" + (200 * 1024 * 1024).to_bytes(4, "big"))
        assert probe.recv(10) == b""
        probe.close()
        assert any("more than" in r for r in gate.refused)


def test_closing_stops_accepting_and_wakes_a_blocked_sender() -> None:
    gate = InputGate(["a"], token=TOKEN, generation=0, capacity=1)
    port = gate.port
    out = OutputChannel(address(gate), "a", token=TOKEN, generation=0)
    failed = threading.Event()
    big = Records(pa.record_batch({"x": pa.array(bytes(1024) for _ in range(1024))}))

    def flood() -> None:
        try:
            while True:
                out.send(big)  # blocks once the gate stops reading
        except ChannelError:
            failed.set()

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    deadline = time.monotonic() + WAIT
    while gate.buffered("a") < 1:
        assert time.monotonic() < deadline
        threading.Event().wait(0.01)
    gate.close()
    out.close()  # wakes the sender blocked in sendall
    sender.join(WAIT)
    assert failed.is_set()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_several_threads_may_send_on_one_channel() -> None:
    with InputGate(["a"], token=TOKEN, generation=0) as gate:
        out = OutputChannel(address(gate), "a", token=TOKEN, generation=0)

        def send(name: str) -> None:
            for k in range(200):
                out.send(Records([name, k, "x" * 5000]))

        threads = [threading.Thread(target=send, args=(n,)) for n in "pq"]
        for t in threads:
            t.start()
        got = []
        while len(got) < 400:
            item = gate.poll(timeout=WAIT)
            assert item is not None
            got.append(item[1])
        for t in threads:
            t.join(WAIT)
        out.close()
    for name in "pq":  # every frame whole, each thread's frames in its own order
        assert [r.batch[1] for r in got if r.batch[0] == name] == list(range(200))


# ------------------------------------------------------------ credits, priority, promotion


def test_close_returns_while_a_send_is_stuck_in_sendall() -> None:
    """A receiver that granted credit and then stopped reading (a frozen worker) leaves a send
    blocked in sendall; close() must still return (the slot must be able to tear down)."""
    server = socket.create_server(("127.0.0.1", 0))
    peer: list[socket.socket] = []

    def frozen_receiver() -> None:
        conn, _ = server.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.recv(4096)  # the hello
        conn.sendall(encode_credit(1000))  # plenty of credit, then never reads again
        peer.append(conn)

    threading.Thread(target=frozen_receiver, daemon=True).start()
    out = OutputChannel(("127.0.0.1", server.getsockname()[1]), "c", token=TOKEN, generation=0)
    deadline = time.monotonic() + WAIT
    while not peer and time.monotonic() < deadline:
        time.sleep(0.01)

    def sender() -> None:
        with contextlib.suppress(ChannelError):
            for _ in range(50):
                out.send(Records([b"x" * 1_000_000]))  # sendall blocks soon

    sending = threading.Thread(target=sender, daemon=True)
    sending.start()
    time.sleep(1.0)  # let the sender get stuck inside sendall (if it does not, close is easy)
    closer = threading.Thread(target=out.close, daemon=True)
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive()
    server.close()


def _drain_into(handler: BarrierAligner, gate: InputGate) -> list[int]:
    seen = []
    while (item := gate.poll(handler.blocked_channels, timeout=2.0)) is not None:
        channel, frame = item
        if isinstance(frame, PriorityBarrier):
            seen.append(frame.barrier.checkpoint_id)
            handler.barrier_received(
                frame.barrier.checkpoint_id, channel, unaligned=True, overtaken=frame.overtaken
            )
        elif isinstance(frame, Barrier):
            seen.append(frame.checkpoint_id)
            handler.barrier_received(frame.checkpoint_id, channel)
        elif isinstance(frame, Records):
            handler.message_received(channel, frame)
    return seen


def test_promoting_a_queued_barrier_at_the_sender_drops_older_queued_barriers() -> None:
    with InputGate(["b"], token=TOKEN, generation=0, capacity=1) as gate:
        out = OutputChannel(address(gate), "b", token=TOKEN, generation=0, capacity=8)
        out.send(Records(["r0"]))  # uses the only credit
        deadline = time.monotonic() + WAIT
        while gate.buffered("b") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        out.send(Records(["r1"]))  # queued from here on
        out.send(Barrier(1))  # checkpoint 1: aborted meanwhile
        out.send(Records(["r2"]))
        out.send(Barrier(2))
        assert [f.batch for f in out.promote(2) or []] == [["r1"], ["r2"]]
        handler: BarrierAligner[str] = BarrierAligner(["b"], name="x")
        handler.abort(1)
        ending = threading.Thread(target=out.send, args=(EndOfInput(),), daemon=True)
        ending.start()  # returns once the receiver took everything
        assert _drain_into(handler, gate) == [2]  # Barrier(1) never arrives after it
        ending.join(WAIT)
        out.close()


def test_promoting_a_queued_barrier_at_the_receiver_drops_older_queued_barriers() -> None:
    with InputGate(["a", "b"], token=TOKEN, generation=0, capacity=8) as gate:
        b = OutputChannel(address(gate), "b", token=TOKEN, generation=0)
        b.send(Barrier(1))
        b.send(Records(["r"]))
        b.send(Barrier(2))
        deadline = time.monotonic() + WAIT
        while gate.buffered("b") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        handler: BarrierAligner[str] = BarrierAligner(["a", "b"], name="x")
        handler.abort(1)
        handler.alignment_timed_out(2)  # no barrier of 2 came yet: this subtask initiates it
        promoted = gate.promote(2)
        assert promoted == [("b", (Records(["r"]),))]
        for channel, ahead in promoted:
            handler.barrier_received(2, channel, unaligned=True, overtaken=ahead)
        b.send(EndOfInput())
        assert _drain_into(handler, gate) == []  # the stale Barrier(1) is gone too
        b.close()


def test_an_unaligned_barrier_overtakes_both_queues_and_hands_over_what_it_jumped() -> None:
    with InputGate(["a"], token=TOKEN, generation=0, capacity=2) as gate:
        out = OutputChannel(address(gate), "a", token=TOKEN, generation=0, capacity=4)
        for k in range(5):
            out.send(Records([k]))  # 2 go out on credit, 3 wait at the sender
        deadline = time.monotonic() + WAIT
        while gate.buffered("a") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        kept = out.send_priority(Barrier(9, unaligned=True))
        assert [f.batch for f in kept] == [[2], [3], [4]]  # the output side of channel state
        channel, frame = gate.poll(timeout=WAIT, priority_only=True) or ("", None)
        assert channel == "a"
        assert frame == PriorityBarrier(Barrier(9, unaligned=True), (Records([0]), Records([1])))
        ending = threading.Thread(target=out.send, args=(EndOfInput(),), daemon=True)
        ending.start()
        rest = [f for _, f in drain(gate)]
        ending.join(WAIT)
        assert rest == [Records([k]) for k in range(5)] + [EndOfInput()]  # still delivered
        out.close()


def test_a_back_edge_keeps_no_count_of_its_frames_and_a_channel_gives_back_what_was_read():
    """A loop's back edge has unbounded credit, given once: it must not keep a record of every
    frame it ever sent (memory, and the records a barrier waits behind); an ordinary channel
    forgets each frame as the receiver consumes it."""
    with InputGate(["loop", "plain"], token=TOKEN, generation=0, back_edges=["loop"]) as gate:
        address = ("127.0.0.1", gate.port)
        with (
            OutputChannel(address, "loop", token=TOKEN, generation=0) as loop,
            OutputChannel(address, "plain", token=TOKEN, generation=0) as plain,
        ):
            for i in range(50):
                loop.send(Records([i]))
                plain.send(Records([i]))
                while (item := gate.poll(timeout=10)) is not None and item[0] != "plain":
                    pass  # (both channels, round robin)
            loop.send(EndOfInput())
            while gate.poll(timeout=0.5) is not None:
                pass
            assert loop.records_ahead() == 0 and not loop._unconsumed
            assert plain.records_ahead() <= 1  # its newest frame's credit may be on its way
