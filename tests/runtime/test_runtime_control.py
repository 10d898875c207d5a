"""The control connection between the driver and the tasks, over real TCP sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

from cutline.runtime.network.control import ControlClient, ControlServer, Event
from cutline.runtime.network.messages import (
    Ack,
    Complete,
    ControlError,
    Decline,
    Finished,
    Gates,
    Lost,
    Peers,
    Stop,
    Trigger,
)

TOKEN = b"0123abcd"
WAIT = 30.0  # a bound against a hang only


def address(server: ControlServer) -> tuple[str, int]:
    return ("127.0.0.1", server.port)


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_messages_flow_both_ways() -> None:
    with ControlServer(["source-0", "sum-0"], token=TOKEN, generation=2) as server:
        with (
            ControlClient(address(server), "source-0", token=TOKEN, generation=2) as source,
            ControlClient(address(server), "sum-0", token=TOKEN, generation=2) as total,
        ):
            ack = Ack("source-0", 1, {"path": "g2-source-0.state", "size": 3}, alignment=0.5)
            source.send(ack)
            assert server.next_event(WAIT) == Event("source-0", ack)
            wait_until(lambda: server.connected == {"source-0", "sum-0"})
            server.send("source-0", Trigger(2, base=1))
            assert source.receive(WAIT) == Trigger(2, final=False, savepoint=False, base=1)
            server.broadcast(Complete(1))
            assert source.receive(WAIT) == Complete(1)
            assert total.receive(WAIT) == Complete(1)
            total.send(Decline("sum-0", 2, "alignment aborted"))
            assert server.next_event(WAIT) == Event(
                "sum-0", Decline("sum-0", 2, "alignment aborted")
            )
            source.send(Finished({}, {}))
            total.send(Finished({"sum-0": 3}, {}))
            got = [server.next_event(WAIT) for _ in range(2)]
            assert sorted((e.task, e.message.kind) for e in got if e) == [
                ("source-0", "finished"),
                ("sum-0", "finished"),
            ]
        # both finished before closing: no "lost" event
        assert server.next_event(0.2) is None


def test_the_rendezvous_goes_through_the_driver() -> None:
    """Each slot says where its gates are; the driver answers every slot with all of them,
    in slot order (``JobAttempt`` does this once the last slot said)."""
    with (
        ControlServer(["slot-0", "slot-1"], token=TOKEN, generation=0) as server,
        ControlClient(address(server), "slot-0", token=TOKEN, generation=0) as zero,
        ControlClient(address(server), "slot-1", token=TOKEN, generation=0) as one,
    ):
        zero.send(Gates("10.0.0.1", {"window": 4101}))
        one.send(Gates("10.0.0.2", {"window": 4102}))
        events = [server.next_event(WAIT) for _ in range(2)]
        assert {e.task: e.message for e in events if e is not None} == {
            "slot-0": Gates("10.0.0.1", {"window": 4101}),
            "slot-1": Gates("10.0.0.2", {"window": 4102}),
        }
        peers = Peers(["10.0.0.1", "10.0.0.2"], [{"window": 4101}, {"window": 4102}])
        server.broadcast(peers)
        assert zero.receive(WAIT) == peers
        assert one.receive(WAIT) == peers


def test_a_task_that_disappears_is_reported_lost() -> None:
    with ControlServer(["t"], token=TOKEN, generation=0) as server:
        client = ControlClient(address(server), "t", token=TOKEN, generation=0)
        client.send(Ack("t", 1, {}))
        client.close()  # e.g. its Python worker was killed
        assert server.next_event(WAIT) == Event("t", Ack("t", 1, {}))
        event = server.next_event(WAIT)
        assert event is not None and event.task == "t" and isinstance(event.message, Lost)
        with pytest.raises(ControlError, match="'t' is not connected"):
            server.send("t", Stop())


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        ({"kind": "hello", "task": "t", "generation": 1, "token": "guess"}, "without this job's"),
        ({"kind": "hello", "task": "t", "generation": 0, "token": "0123abcd"}, "generation 0"),
        ({"kind": "hello", "task": "x", "generation": 1, "token": "0123abcd"}, "'x' is not a task"),
        ({"kind": "ack", "checkpoint": 1}, "without this job's hello"),
    ],
)
def test_foreign_and_stale_tasks_are_refused(hello: dict[str, object], reason: str) -> None:
    with ControlServer(["t"], token=TOKEN, generation=1) as server:
        intruder = socket.create_connection(address(server))
        intruder.sendall(json.dumps(hello).encode() + b"\n" + b'{"kind":"ack","checkpoint":9}\n')
        assert intruder.recv(10) == b""  # closed by the driver
        intruder.close()
        assert server.next_event(0.2) is None  # nothing reached the coordinator
        assert any(reason in r for r in server.refused)


def test_a_driver_that_goes_away_is_an_error_for_the_task() -> None:
    server = ControlServer(["t"], token=TOKEN, generation=0)
    client = ControlClient(address(server), "t", token=TOKEN, generation=0)
    wait_until(lambda: server.connected == {"t"})
    server.close()
    with pytest.raises(ControlError, match="driver closed the control connection"):
        client.receive(WAIT)
    client.close()


def test_garbage_from_a_task_loses_it_with_the_reason() -> None:
    with ControlServer(["t"], token=TOKEN, generation=0) as server:
        conn = socket.create_connection(address(server))
        conn.sendall(b'{"kind":"hello","task":"t","generation":0,"token":"0123abcd"}\n')
        conn.sendall(b"this is not json\n")
        event = server.next_event(WAIT)
        assert event == Event("t", Lost("a control message is not JSON"))
        conn.close()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"kind":"trigger","checkpoint":1}', "task 't' sent an unknown message 'trigger'"),
        (b'{"kind":"ack","subtask":"s","handle":{}}', "an 'ack' message without 'checkpoint'"),
        (
            b'{"kind":"ack","subtask":"s","checkpoint":"1","handle":{}}',
            "an 'ack' message whose 'checkpoint' is '1', not int",
        ),
        (
            b'{"kind":"decline","subtask":"s","checkpoint":true,"reason":"x"}',
            "a 'decline' message whose 'checkpoint' is True, not int",
        ),
        (b'{"kind":"finished","records_in":[],"metrics":{}}', "'records_in' is [], not dict"),
        (
            b'{"kind":"gates","host":"h","ports":{"window":"4101"}}',
            "a 'gates' message whose 'ports' is {'window': '4101'}, not dict",
        ),
    ],
)
def test_a_message_of_the_wrong_side_or_shape_loses_the_task_naming_it(
    line: bytes, reason: str
) -> None:
    with ControlServer(["t"], token=TOKEN, generation=0) as server:
        conn = socket.create_connection(address(server))
        conn.sendall(
            b'{"kind":"hello","task":"t","generation":0,"token":"0123abcd"}\n' + line + b"\n"
        )
        event = server.next_event(WAIT)
        assert event is not None and isinstance(event.message, Lost), event
        assert reason in event.message.reason
        conn.close()


def test_an_unreachable_driver_is_named() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ControlError, match=f"cannot reach the driver at 127.0.0.1:{port}"):
        ControlClient(("127.0.0.1", port), "t", token=TOKEN, generation=0, connect_timeout=5)


def test_a_task_lost_for_garbage_can_connect_again() -> None:
    with ControlServer(["t"], token=TOKEN, generation=0) as server:
        conn = socket.create_connection(address(server))
        conn.sendall(b'{"kind":"hello","task":"t","generation":0,"token":"0123abcd"}\nnot json\n')
        event = server.next_event(WAIT)
        assert event is not None and isinstance(event.message, Lost)
        conn.close()
        wait_until(lambda: server.connected == frozenset())
        with ControlClient(address(server), "t", token=TOKEN, generation=0) as again:
            again.send(Finished({}, {}))
            assert server.next_event(WAIT) == Event("t", Finished({}, {}))


def test_concurrent_sends_from_a_task_stay_whole() -> None:
    with ControlServer(["t"], token=TOKEN, generation=0) as server:
        client = ControlClient(address(server), "t", token=TOKEN, generation=0)

        def send(name: str) -> None:
            for k in range(50):
                client.send(Ack("t", k, {"who": name, "pad": "x" * 200_000}))

        threads = [threading.Thread(target=send, args=(n,)) for n in "pq"]
        for t in threads:
            t.start()
        got = [server.next_event(WAIT) for _ in range(100)]
        for t in threads:
            t.join(WAIT)
        acks = [e.message for e in got if e is not None and isinstance(e.message, Ack)]
        assert len(acks) == 100
        for name in "pq":
            assert [a.checkpoint for a in acks if a.handle["who"] == name] == list(range(50))
        client.close()


def test_closing_the_server_stops_accepting() -> None:
    server = ControlServer(["t"], token=TOKEN, generation=0)
    port = server.port
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_generation_that_only_looks_equal_is_refused() -> None:
    with ControlServer(["t"], token=TOKEN, generation=1) as server:
        for fake in ("true", "1.0"):
            intruder = socket.create_connection(address(server))
            hello = f'{{"kind":"hello","task":"t","generation":{fake},"token":"0123abcd"}}\n'
            intruder.sendall(hello.encode())
            assert intruder.recv(10) == b""
            intruder.close()
        assert server.connected == frozenset()


def test_a_binary_token_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="must be ASCII bytes"):
        ControlServer(["t"], token=b"\xff\xfe", generation=0)


def test_closing_the_server_closes_a_connection_that_never_said_hello() -> None:
    server = ControlServer(["t"], token=TOKEN, generation=0)
    silent = socket.create_connection(address(server))
    server.close()
    silent.settimeout(WAIT)
    # closed by the server (FIN, or RST if it was never accepted), not left to time out
    with contextlib.suppress(ConnectionResetError):
        assert silent.recv(10) == b""
    silent.close()
