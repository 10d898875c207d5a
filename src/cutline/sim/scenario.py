"""The event-script format: a topology file and an events file (the simulator page's "Topology
file" and "Events file").

Topology file::

    3            # number of processes
    N1 10        # ID TOKENS, one line per process
    N2 0
    N3 5
    N1 N2        # SRC DST, one line per one-way channel
    N2 N3
    N3 N1

Events file, one event per line, in order::

    send N1 N2 4     # N1 pays 4 tokens to N2 (debited now, credited on delivery)
    snapshot N2      # N2 initiates snapshot 0 (ids count 0, 1, 2, ... in file order)
    tick 3           # time advances 3 steps (default 1)

Blank lines and lines starting with ``#`` are ignored; a ``#`` after the
fields starts a comment too. Every problem is reported as a
:class:`ScenarioError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_INTEGER = re.compile(r"-?[0-9]+")

Channel = tuple[str, str]
"""A one-way channel, as ``(source, destination)``."""


class ScenarioError(ValueError):
    """A malformed topology or events file, or an event that cannot be carried out."""

    def __init__(self, path: str | None, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = path or "<input>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Topology:
    """Processes (banks holding tokens) and the one-way FIFO channels between them."""

    processes: tuple[str, ...]
    balances: dict[str, int]
    channels: tuple[Channel, ...]
    path: str | None = None

    def __post_init__(self) -> None:
        if not self.processes:
            raise ScenarioError(self.path, None, "empty topology: it declares no process")
        known = set(self.processes)
        if len(known) != len(self.processes):
            raise ScenarioError(self.path, None, "a process id is declared twice")
        if set(self.balances) != known:
            raise ScenarioError(self.path, None, "the balances do not match the processes")
        for pid, tokens in self.balances.items():
            if tokens < 0:
                raise ScenarioError(self.path, None, f"process {pid!r} holds {tokens} tokens")
        for src, dst in self.channels:
            if src not in known or dst not in known:
                raise ScenarioError(
                    self.path, None, f"channel {src} -> {dst} names an unknown process"
                )
            if src == dst:
                raise ScenarioError(self.path, None, f"channel {src} -> {dst} leads to itself")
        if len(set(self.channels)) != len(self.channels):
            raise ScenarioError(self.path, None, "a channel is declared twice")

    @property
    def total_tokens(self) -> int:
        return sum(self.balances.values())

    def inputs(self, process: str) -> tuple[Channel, ...]:
        return tuple(c for c in self.channels if c[1] == process)

    def outputs(self, process: str) -> tuple[Channel, ...]:
        return tuple(c for c in self.channels if c[0] == process)


@dataclass(frozen=True)
class Send:
    """``send SRC DST K``: ``src`` pays ``amount`` tokens to ``dst``."""

    src: str
    dst: str
    amount: int
    line: int | None = None

    def __post_init__(self) -> None:
        if type(self.amount) is not int or self.amount < 1:
            raise ScenarioError(
                None, self.line, f"a payment must be of 1 token or more, not {self.amount!r}"
            )
        if self.src == self.dst:
            raise ScenarioError(None, self.line, f"{self.src} cannot pay itself")


@dataclass(frozen=True)
class Initiate:
    """``snapshot ID``: ``process`` initiates snapshot ``snapshot_id``.

    The file format numbers snapshots in file order; programs may give the
    same id to several initiators.
    """

    process: str
    snapshot_id: int
    line: int | None = None

    def __post_init__(self) -> None:
        if type(self.snapshot_id) is not int or self.snapshot_id < 0:
            raise ScenarioError(
                None,
                self.line,
                f"a snapshot id must be a whole number >= 0, not {self.snapshot_id!r}",
            )


@dataclass(frozen=True)
class Tick:
    """``tick [N]``: time advances ``steps`` steps."""

    steps: int = 1
    line: int | None = None

    def __post_init__(self) -> None:
        if type(self.steps) is not int or self.steps < 1:
            raise ScenarioError(
                None, self.line, f"a tick must be of 1 step or more, not {self.steps!r}"
            )


Event = Send | Initiate | Tick


@dataclass(frozen=True)
class Scenario:
    """A topology and the script of events to run on it."""

    topology: Topology
    events: tuple[Event, ...]
    events_path: str | None = None

    def __post_init__(self) -> None:
        known = set(self.topology.processes)
        channels = set(self.topology.channels)
        for event in self.events:
            if isinstance(event, Send) and (event.src, event.dst) not in channels:
                raise ScenarioError(
                    self.events_path,
                    event.line,
                    f"there is no channel from {event.src} to {event.dst}",
                )
            if isinstance(event, Initiate) and event.process not in known:
                raise ScenarioError(
                    self.events_path, event.line, f"unknown process {event.process!r}"
                )

    @property
    def snapshot_ids(self) -> tuple[int, ...]:
        """Every snapshot id the script initiates, in order of first appearance."""
        seen: dict[int, None] = {}
        for event in self.events:
            if isinstance(event, Initiate):
                seen.setdefault(event.snapshot_id, None)
        return tuple(seen)


def _lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """The meaningful lines of ``text`` as ``(line number, fields)``.

    Only ``\n`` ends a line (``str.split`` on whitespace drops a ``\r`` before
    it), so line numbers are the ones an editor or ``grep -n`` shows.
    """
    for number, raw in enumerate(text.split("\n"), start=1):
        content = raw.split("#", 1)[0].strip()
        if content:
            yield number, content.split()


def _count(path: str | None, line: int, text: str, what: str, *, minimum: int) -> int:
    if _INTEGER.fullmatch(text) is None:
        raise ScenarioError(path, line, f"{what} must be a whole number, not {text!r}")
    value = int(text)
    if value < minimum:
        raise ScenarioError(path, line, f"{what} must be at least {minimum}, not {value}")
    return value


def parse_topology(text: str, path: str | None = None) -> Topology:
    """Parse a topology file's text; ``path`` names it in errors."""
    lines = list(_lines(text))
    if not lines:
        raise ScenarioError(path, None, "empty topology: the file has no process count")
    number, fields = lines[0]
    if len(fields) != 1:
        raise ScenarioError(
            path,
            number,
            f"the first line must be the number of processes, not {' '.join(fields)!r}",
        )
    count_line = number
    if _INTEGER.fullmatch(fields[0]) and int(fields[0]) == 0:
        raise ScenarioError(path, number, "empty topology: it declares 0 processes")
    n = _count(path, number, fields[0], "the number of processes", minimum=1)
    processes: list[str] = []
    balances: dict[str, int] = {}
    for number, fields in lines[1 : n + 1]:
        if len(fields) != 2:
            raise ScenarioError(
                path, number, f"expected a process line 'ID TOKENS', got {' '.join(fields)!r}"
            )
        pid, tokens = fields
        if _INTEGER.fullmatch(tokens) is None and tokens in balances:
            raise ScenarioError(
                path,
                number,
                f"expected a process line 'ID TOKENS', got the channel {pid} {tokens}: line "
                f"{count_line} declares {n} processes but only {len(processes)} are listed",
            )
        if pid in balances:
            raise ScenarioError(path, number, f"process {pid!r} is declared twice")
        balances[pid] = _count(path, number, tokens, f"the tokens of {pid}", minimum=0)
        processes.append(pid)
    if len(processes) < n:
        raise ScenarioError(
            path, count_line, f"the file declares {n} processes but lists only {len(processes)}"
        )
    channels: list[Channel] = []
    seen: set[Channel] = set()
    for number, fields in lines[n + 1 :]:
        if len(fields) != 2:
            raise ScenarioError(
                path, number, f"expected a channel line 'SRC DST', got {' '.join(fields)!r}"
            )
        src, dst = fields
        for pid in (src, dst):
            if pid not in balances:
                raise ScenarioError(path, number, f"unknown process {pid!r} in channel {src} {dst}")
        if src == dst:
            raise ScenarioError(path, number, f"channel {src} {dst} leads from a process to itself")
        if (src, dst) in seen:
            raise ScenarioError(path, number, f"channel {src} {dst} is declared twice")
        seen.add((src, dst))
        channels.append((src, dst))
    return Topology(tuple(processes), balances, tuple(channels), path)


def parse_events(text: str, topology: Topology, path: str | None = None) -> tuple[Event, ...]:
    """Parse an events file's text against ``topology``; ``path`` names it in errors."""
    known = set(topology.processes)
    channels = set(topology.channels)
    events: list[Event] = []
    next_snapshot = 0

    def process(number: int, pid: str) -> str:
        if pid not in known:
            raise ScenarioError(path, number, f"unknown process {pid!r}")
        return pid

    for number, fields in _lines(text):
        verb, args = fields[0], fields[1:]
        if verb == "send":
            if len(args) != 3:
                raise ScenarioError(path, number, "expected 'send SRC DST TOKENS'")
            src, dst = process(number, args[0]), process(number, args[1])
            if (src, dst) not in channels:
                raise ScenarioError(path, number, f"there is no channel from {src} to {dst}")
            amount = _count(path, number, args[2], "the tokens sent", minimum=1)
            events.append(Send(src, dst, amount, number))
        elif verb == "snapshot":
            if not args:
                raise ScenarioError(path, number, "expected 'snapshot ID [ID ...]'")
            if len(set(args)) != len(args):
                raise ScenarioError(path, number, "a process is named twice in one snapshot line")
            # Several ids on one line (a cutline extension): they all initiate the same snapshot.
            events += [Initiate(process(number, pid), next_snapshot, number) for pid in args]
            next_snapshot += 1
        elif verb == "tick":
            if len(args) > 1:
                raise ScenarioError(path, number, "expected 'tick' or 'tick STEPS'")
            steps = _count(path, number, args[0], "the steps of a tick", minimum=1) if args else 1
            events.append(Tick(steps, number))
        else:
            raise ScenarioError(
                path, number, f"unknown event {verb!r}: expected 'send', 'snapshot' or 'tick'"
            )
    return tuple(events)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ScenarioError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise ScenarioError(str(path), None, "is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(str(path), None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ScenarioError(str(path), None, f"cannot be read: {exc.strerror}") from None


def load_scenario(topology_path: str | Path, events_path: str | Path) -> Scenario:
    """Read and check a topology file and an events file."""
    tpath, epath = Path(topology_path), Path(events_path)
    topology = parse_topology(_read(tpath), str(tpath))
    events = parse_events(_read(epath), topology, str(epath))
    return Scenario(topology, events, str(epath))


def scenario_from_text(topology: str, events: str) -> Scenario:
    """Build a scenario from the two files' texts (for tests and examples)."""
    topo = parse_topology(topology, "<topology>")
    return Scenario(topo, parse_events(events, topo, "<events>"), "<events>")


def format_topology(topology: Topology) -> str:
    """The topology in the file format (round-trips through :func:`parse_topology`)."""
    out = [str(len(topology.processes))]
    out += [f"{p} {topology.balances[p]}" for p in topology.processes]
    out += [f"{s} {d}" for s, d in topology.channels]
    return "\n".join(out) + "\n"


def format_events(events: Sequence[Event]) -> str:
    """The events in the file format (round-trips through :func:`parse_events`).

    The format numbers snapshots in order, so each id must be the next one; the
    initiators of one id must follow each other, and share one ``snapshot`` line.
    """
    out: list[str] = []
    next_id = 0
    for event in events:
        if isinstance(event, Send):
            out.append(f"send {event.src} {event.dst} {event.amount}")
        elif isinstance(event, Initiate):
            if event.snapshot_id == next_id - 1 and out[-1].startswith("snapshot "):
                out[-1] += f" {event.process}"
                continue
            if event.snapshot_id != next_id:
                raise ValueError(
                    f"snapshot {event.snapshot_id} cannot be written here: the file format "
                    f"numbers snapshots in order, and the next one is {next_id}"
                )
            out.append(f"snapshot {event.process}")
            next_id += 1
        else:
            out.append("tick" if event.steps == 1 else f"tick {event.steps}")
    return "\n".join(out) + "\n"
