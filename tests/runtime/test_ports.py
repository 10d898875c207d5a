"""``CUTLINE_PORTS``: every port cutline listens on, inside a range a firewall lets through."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cutline import StreamEnvironment, testing
from cutline.runtime.network import net
from cutline.runtime.network.control import ControlServer
from cutline.runtime.network.net import PortsError, port_range
from cutline.runtime.task.local import ThreadLauncher


@pytest.mark.parametrize(
    ("text", "expected"),
    [("40000-40009", range(40000, 40010)), (" 5000-5000 ", range(5000, 5001)), ("7", range(7, 8))],
)
def test_a_range_is_read(text: str, expected: range) -> None:
    assert port_range(text) == expected


@pytest.mark.parametrize("text", ["40010-40000", "0-10", "1-70000", "a-b", "40000-", "-5"])
def test_a_malformed_range_is_named(text: str) -> None:
    with pytest.raises(PortsError, match=r"CUTLINE_PORTS=.* is not a port range: use LOW-HIGH"):
        port_range(text)


def test_unset_means_any_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTLINE_PORTS", raising=False)
    assert port_range() is None
    monkeypatch.setenv("CUTLINE_PORTS", "  ")
    assert port_range() is None


def free_range(size: int) -> range:
    """``size`` consecutive ports free right now (a best guess: bound and released)."""
    for base in range(41000, 60000, size):
        sockets = []
        try:
            for port in range(base, base + size):
                sockets.append(socket.create_server(("0.0.0.0", port)))
            return range(base, base + size)
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.skip("no free port range found")


def test_listeners_take_ports_of_the_range_and_say_when_it_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = free_range(3)
    monkeypatch.setenv("CUTLINE_PORTS", f"{ports.start}-{ports.stop - 1}")
    servers = [ControlServer(["slot-0"], token=b"t" * 32, generation=1) for _ in ports]
    try:
        assert sorted(s.port for s in servers) == list(ports)
        with pytest.raises(PortsError, match=r"every port of CUTLINE_PORTS=.* is in use"):
            net.listen("0.0.0.0", 8)
    finally:
        for server in servers:
            server.close()


def test_a_job_listens_only_inside_the_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ports = free_range(20)
    monkeypatch.setenv("CUTLINE_PORTS", f"{ports.start}-{ports.stop - 1}")
    used: list[int] = []
    listen = net.listen

    def recording(host: str, backlog: int) -> socket.socket:
        server = listen(host, backlog)
        used.append(server.getsockname()[1])
        return server

    monkeypatch.setattr(net, "listen", recording)
    env = StreamEnvironment(parallelism=2, checkpoint_dir=tmp_path / "ck", checkpoint_interval=0.2)
    env.from_sequence(0, 2000).map(lambda r: {"k": r["value"] % 7}).key_by("k").count().collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    assert len(result.output) == 2000
    # the driver's control server and savepoint endpoint, and one gate per keyed subtask
    assert len(used) >= 4
    assert all(port in ports for port in used)
