"""Unit tests of the event-script format (SEMANTICS.md §6): ``cutline.sim.scenario``.

Valid topology and events files (comments, blank lines, trailing ``#`` comments,
the default ``tick``), the round trip ``format_* -> parse_*``, and every error
path, each checked for the exact file name, line number and message of its
:class:`ScenarioError`.

"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.sim.scenario import (
    Event,
    Initiate,
    Scenario,
    ScenarioError,
    Send,
    Tick,
    Topology,
    format_events,
    format_topology,
    load_scenario,
    parse_events,
    parse_topology,
    scenario_from_text,
)
from cutline.sim.simulator import SimConfig, simulate

TOP = "net.top"
EVT = "net.events"

# N1 <-> N2, N1 -> N3; N3 has no output channel.
TOPOLOGY_TEXT = "3\nN1 10\nN2 0\nN3 5\nN1 N2\nN2 N1\nN1 N3\n"


@pytest.fixture
def topology() -> Topology:
    return parse_topology(TOPOLOGY_TEXT, TOP)


def _strip_lines(events: tuple[Event, ...]) -> list[Event]:
    return [dataclasses.replace(e, line=None) for e in events]


def _assert_error(exc: ScenarioError, path: str | None, line: int | None, message: str) -> None:
    assert exc.path == path
    assert exc.line == line
    assert exc.message == message
    where = path or "<input>"
    if line is not None:
        where = f"{where}:{line}"
    assert str(exc) == f"{where}: {message}"
    assert isinstance(exc, ValueError)


# ------------------------------------------------------------------ valid topology files


def test_topology_with_comments_blank_lines_and_trailing_comments() -> None:
    text = (
        "# A ring of three banks.\n"
        "\n"
        "3        # number of processes\n"
        "   # an indented comment\n"
        "N1 10    # the rich one\n"
        "N2\t0\n"
        "\n"
        "N3   5   \n"
        "N1 N2\n"
        "# channels below\n"
        "N2 N3 #trailing\n"
        "N3 N1\n"
        "\n"
    )
    topo = parse_topology(text, TOP)
    assert topo.processes == ("N1", "N2", "N3")
    assert topo.balances == {"N1": 10, "N2": 0, "N3": 5}
    assert topo.channels == (("N1", "N2"), ("N2", "N3"), ("N3", "N1"))
    assert topo.path == TOP
    assert topo.total_tokens == 15
    assert topo.inputs("N1") == (("N3", "N1"),)
    assert topo.outputs("N1") == (("N1", "N2"),)


def test_topology_without_channels_and_with_crlf_line_ends() -> None:
    topo = parse_topology("2\r\nN1 0\r\nB 7\r\n", TOP)
    assert topo.processes == ("N1", "B")
    assert topo.balances == {"N1": 0, "B": 7}
    assert topo.channels == ()


def test_process_order_and_channel_order_follow_the_file() -> None:
    topo = parse_topology("3\nZ 1\nA 2\nM 3\nM A\nA Z\nZ M\n")
    assert topo.processes == ("Z", "A", "M")
    assert topo.channels == (("M", "A"), ("A", "Z"), ("Z", "M"))
    assert topo.path is None


# ------------------------------------------------------------------ topology errors


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param("", None, "empty topology: the file has no process count", id="empty"),
        pytest.param(
            "# only a comment\n\n   \n",
            None,
            "empty topology: the file has no process count",
            id="only-comments",
        ),
        pytest.param(
            "# nothing here\n0\n", 2, "empty topology: it declares 0 processes", id="zero"
        ),
        pytest.param(
            "three\nN1 1\n",
            1,
            "the number of processes must be a whole number, not 'three'",
            id="count-not-a-number",
        ),
        pytest.param(
            "2.5\n",
            1,
            "the number of processes must be a whole number, not '2.5'",
            id="count-float",
        ),
        pytest.param(
            "-1\n", 1, "the number of processes must be at least 1, not -1", id="count-negative"
        ),
        pytest.param(
            "2 N1\nN1 1\nN2 2\n",
            1,
            "the first line must be the number of processes, not '2 N1'",
            id="count-two-fields",
        ),
        pytest.param(
            "\n3\nN1 1\n# a comment\nN2 2\n",
            2,
            "the file declares 3 processes but lists only 2",
            id="fewer-process-lines",
        ),
        pytest.param(
            "2\n# banks\nN1 1 2\nN2 2\n",
            3,
            "expected a process line 'ID TOKENS', got 'N1 1 2'",
            id="process-three-fields",
        ),
        pytest.param(
            "2\nN1 1\nN2\n",
            3,
            "expected a process line 'ID TOKENS', got 'N2'",
            id="process-one-field",
        ),
        pytest.param(
            "2\nN1 1\nN2 -3   # in debt\n",
            3,
            "the tokens of N2 must be at least 0, not -3",
            id="negative-tokens",
        ),
        pytest.param(
            "2\nN1 ten\nN2 1\n",
            2,
            "the tokens of N1 must be a whole number, not 'ten'",
            id="non-numeric-tokens",
        ),
        pytest.param(
            "2\nN1 1.5\nN2 1\n",
            2,
            "the tokens of N1 must be a whole number, not '1.5'",
            id="fractional-tokens",
        ),
        pytest.param(
            "3\nN1 1\n\nN2 2\nN1 3\n",
            5,
            "process 'N1' is declared twice",
            id="process-declared-twice",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\nN1 N2\nN1 N3\n",
            5,
            "unknown process 'N3' in channel N1 N3",
            id="channel-unknown-destination",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\n# channels\nN9 N1\n",
            5,
            "unknown process 'N9' in channel N9 N1",
            id="channel-unknown-source",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\nN1 N2\nN2 N2\n",
            5,
            "channel N2 N2 leads from a process to itself",
            id="self-loop",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\nN1 N2\nN2 N1\n\nN1 N2  # again\n",
            7,
            "channel N1 N2 is declared twice",
            id="duplicate-channel",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\nN1 N2 N1\n",
            4,
            "expected a channel line 'SRC DST', got 'N1 N2 N1'",
            id="channel-three-fields",
        ),
        pytest.param(
            "2\nN1 1\nN2 2\nN1\n",
            4,
            "expected a channel line 'SRC DST', got 'N1'",
            id="channel-one-field",
        ),
    ],
)
def test_topology_errors(text: str, line: int | None, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_topology(text, TOP)
    _assert_error(info.value, TOP, line, message)


def test_topology_error_without_a_path_names_input() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_topology("1\nN1 x\n")
    _assert_error(info.value, None, 2, "the tokens of N1 must be a whole number, not 'x'")
    assert str(info.value) == "<input>:2: the tokens of N1 must be a whole number, not 'x'"


def test_topology_constructor_checks() -> None:
    with pytest.raises(ScenarioError) as info:
        Topology((), {}, (), "t.top")
    _assert_error(info.value, "t.top", None, "empty topology: it declares no process")
    with pytest.raises(ScenarioError) as info:
        Topology(("A", "A"), {"A": 1}, ())
    _assert_error(info.value, None, None, "a process id is declared twice")
    with pytest.raises(ScenarioError) as info:
        Topology(("A", "B"), {"A": 1, "B": 1}, (("A", "C"),))
    _assert_error(info.value, None, None, "channel A -> C names an unknown process")
    with pytest.raises(ScenarioError) as info:
        Topology(("A", "B"), {"A": 1, "B": 1}, (("A", "B"), ("A", "B")))
    _assert_error(info.value, None, None, "a channel is declared twice")


# ------------------------------------------------------------------ valid events files


def test_events_with_comments_blank_lines_and_default_tick(topology: Topology) -> None:
    text = (
        "# a script\n"
        "\n"
        "send N1 N2 4     # N1 pays N2\n"
        "snapshot N2\n"
        "tick\n"
        "   \n"
        "tick 3 # three steps\n"
        "snapshot N1\n"
        "send N2 N1 1\n"
        "send N1 N3 10\n"
        "snapshot N3#no space before the comment\n"
        "tick 1\n"
    )
    events = parse_events(text, topology, EVT)
    assert events == (
        Send("N1", "N2", 4, 3),
        Initiate("N2", 0, 4),
        Tick(1, 5),
        Tick(3, 7),
        Initiate("N1", 1, 8),
        Send("N2", "N1", 1, 9),
        Send("N1", "N3", 10, 10),
        Initiate("N3", 2, 11),
        Tick(1, 12),
    )


def test_snapshot_ids_count_in_file_order(topology: Topology) -> None:
    events = parse_events("snapshot N3\nsnapshot N1\ntick\nsnapshot N3\n", topology)
    initiations = [e for e in events if isinstance(e, Initiate)]
    assert [(e.process, e.snapshot_id) for e in initiations] == [("N3", 0), ("N1", 1), ("N3", 2)]
    scenario = Scenario(topology, events)
    assert scenario.snapshot_ids == (0, 1, 2)


def test_empty_events_file_is_an_empty_script(topology: Topology) -> None:
    assert parse_events("", topology, EVT) == ()
    assert parse_events("# nothing\n\n", topology, EVT) == ()


def test_parse_accepts_a_send_larger_than_the_balance(topology: Topology) -> None:
    """Balances are checked when the script runs: the parser only checks the syntax."""
    events = parse_events("send N2 N1 1\n", topology, EVT)
    assert events == (Send("N2", "N1", 1, 1),)
    scenario = Scenario(topology, events, EVT)
    with pytest.raises(ScenarioError) as info:
        simulate(scenario, SimConfig(min_delay=1, max_delay=1))
    assert info.value.path == EVT
    assert info.value.line == 1
    assert str(info.value) == f"{EVT}:1: N2 pays 1 token to N1 but holds only 0 tokens at step 0"


# ------------------------------------------------------------------ events errors


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param(
            "tick\nfrob N1\n",
            2,
            "unknown event 'frob': expected 'send', 'snapshot' or 'tick'",
            id="unknown-verb",
        ),
        pytest.param(
            "# comment\nSEND N1 N2 1\n",
            2,
            "unknown event 'SEND': expected 'send', 'snapshot' or 'tick'",
            id="verb-is-case-sensitive",
        ),
        pytest.param("send\n", 1, "expected 'send SRC DST TOKENS'", id="send-no-fields"),
        pytest.param("send N1 N2\n", 1, "expected 'send SRC DST TOKENS'", id="send-two-fields"),
        pytest.param(
            "\nsend N1 N2 3 4\n", 2, "expected 'send SRC DST TOKENS'", id="send-four-fields"
        ),
        pytest.param("send N1 N9 3\n", 1, "unknown process 'N9'", id="send-unknown-destination"),
        pytest.param("send N9 N1 3\n", 1, "unknown process 'N9'", id="send-unknown-source"),
        pytest.param(
            "tick\n\nsend N3 N1 1\n", 3, "there is no channel from N3 to N1", id="send-no-channel"
        ),
        pytest.param("send N1 N1 1\n", 1, "there is no channel from N1 to N1", id="send-to-itself"),
        pytest.param(
            "send N1 N2 0\n", 1, "the tokens sent must be at least 1, not 0", id="send-zero"
        ),
        pytest.param(
            "send N1 N2 -2\n", 1, "the tokens sent must be at least 1, not -2", id="send-negative"
        ),
        pytest.param(
            "send N1 N2 x\n",
            1,
            "the tokens sent must be a whole number, not 'x'",
            id="send-non-numeric",
        ),
        pytest.param("snapshot N9\n", 1, "unknown process 'N9'", id="snapshot-unknown-process"),
        pytest.param("snapshot\n", 1, "expected 'snapshot ID [ID ...]'", id="snapshot-no-process"),
        pytest.param(
            "tick\nsnapshot N1 N1\n",
            2,
            "a process is named twice in one snapshot line",
            id="snapshot-same-process-twice",
        ),
        pytest.param(
            "snapshot N1 N9\n", 1, "unknown process 'N9'", id="snapshot-second-process-unknown"
        ),
        pytest.param(
            "tick\ntick 0\n", 2, "the steps of a tick must be at least 1, not 0", id="tick-0"
        ),
        pytest.param(
            "tick -1\n", 1, "the steps of a tick must be at least 1, not -1", id="tick-negative"
        ),
        pytest.param(
            "tick x\n", 1, "the steps of a tick must be a whole number, not 'x'", id="tick-x"
        ),
        pytest.param("tick 1 2\n", 1, "expected 'tick' or 'tick STEPS'", id="tick-two-numbers"),
    ],
)
def test_events_errors(topology: Topology, text: str, line: int, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_events(text, topology, EVT)
    _assert_error(info.value, EVT, line, message)


def test_first_error_wins(topology: Topology) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_events("send N1 N2 1\ntick 0\nfrob\n", topology, EVT)
    assert info.value.line == 2


# ------------------------------------------------------------------ line numbers


def test_line_numbers_count_newlines_only() -> None:
    # A form feed on its own line (a page break, common in old text files) is line 2;
    # the bad process line is line 3 of the file.
    with pytest.raises(ScenarioError) as info:
        parse_topology("1\n\x0c\nN1 x\n", TOP)
    _assert_error(info.value, TOP, 3, "the tokens of N1 must be a whole number, not 'x'")


def test_comment_runs_to_the_end_of_the_line(topology: Topology) -> None:
    events = parse_events("tick  # later: \u2028send N1 N2 1\n", topology, EVT)
    assert _strip_lines(events) == [Tick(1)]


# ------------------------------------------------------------------ round trip


def test_round_trip_of_a_hand_written_scenario(topology: Topology) -> None:
    events = (
        Send("N1", "N2", 4),
        Initiate("N2", 0),
        Tick(1),
        Tick(3),
        Initiate("N1", 1),
        Send("N1", "N3", 2),
        Initiate("N1", 2),
        Tick(7),
    )
    text = format_events(events)
    assert text == (
        "send N1 N2 4\nsnapshot N2\ntick\ntick 3\nsnapshot N1\nsend N1 N3 2\nsnapshot N1\ntick 7\n"
    )
    assert _strip_lines(parse_events(text, topology)) == list(events)
    assert format_topology(topology) == TOPOLOGY_TEXT
    again = parse_topology(format_topology(topology), TOP)
    assert again == topology


_ids = st.text(alphabet="ABCXYZabcxyz0123456789_-.", min_size=1, max_size=4)


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[Topology, tuple[Event, ...]]:
    names = draw(st.lists(_ids, min_size=1, max_size=6, unique=True))
    balances = {p: draw(st.integers(0, 10**6)) for p in names}
    pairs = [(a, b) for a in names for b in names if a != b]
    channels = draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
    topo = Topology(tuple(names), balances, tuple(channels))
    kinds = ["snapshot", "tick"] + (["send"] if channels else [])
    events: list[Event] = []
    next_id = 0
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=20)):
        if kind == "send":
            src, dst = draw(st.sampled_from(channels))
            events.append(Send(src, dst, draw(st.integers(1, 10**6))))
        elif kind == "snapshot":
            events.append(Initiate(draw(st.sampled_from(names)), next_id))
            next_id += 1
        else:
            events.append(Tick(draw(st.integers(1, 100))))
    return topo, tuple(events)


@settings(max_examples=60)
@given(_scenarios())
def test_round_trip_format_then_parse(case: tuple[Topology, tuple[Event, ...]]) -> None:
    topo, events = case
    parsed = parse_topology(format_topology(topo))
    assert parsed.processes == topo.processes
    assert parsed.balances == topo.balances
    assert parsed.channels == topo.channels
    parsed_events = parse_events(format_events(events), parsed)
    assert _strip_lines(parsed_events) == list(events)
    # the line numbers are those of the formatted file: one event per line
    assert [e.line for e in parsed_events] == list(range(1, len(events) + 1))


# ------------------------------------------------------------------ load_scenario


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_scenario_reads_both_files(tmp_path: Path) -> None:
    top = _write(tmp_path, "net.top", TOPOLOGY_TEXT)
    evt = _write(tmp_path, "net.events", "send N1 N2 1\nsnapshot N1\ntick 2\n")
    scenario = load_scenario(top, evt)
    assert scenario.topology.path == str(top)
    assert scenario.events_path == str(evt)
    assert scenario.topology.processes == ("N1", "N2", "N3")
    assert scenario.events == (Send("N1", "N2", 1, 1), Initiate("N1", 0, 2), Tick(2, 3))
    # str paths work as well as Path objects
    assert load_scenario(str(top), str(evt)) == scenario


def test_scenario_from_text_names_its_inputs() -> None:
    scenario = scenario_from_text(TOPOLOGY_TEXT, "snapshot N1\n")
    assert scenario.topology.path == "<topology>"
    assert scenario.events_path == "<events>"
    with pytest.raises(ScenarioError) as info:
        scenario_from_text(TOPOLOGY_TEXT, "tick\nsnapshot N7\n")
    assert str(info.value) == "<events>:2: unknown process 'N7'"


def test_load_scenario_topology_error_names_the_topology_file(tmp_path: Path) -> None:
    top = _write(tmp_path, "net.top", "2\nN1 1\nN2 2\nN1 N3\n")
    evt = _write(tmp_path, "net.events", "frob\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(top, evt)
    _assert_error(info.value, str(top), 4, "unknown process 'N3' in channel N1 N3")


def test_load_scenario_events_error_names_the_events_file(tmp_path: Path) -> None:
    top = _write(tmp_path, "net.top", TOPOLOGY_TEXT)
    evt = _write(tmp_path, "net.events", "# script\nsend N1 N2 1\n\nsnapshot N4\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(top, evt)
    _assert_error(info.value, str(evt), 4, "unknown process 'N4'")


def test_load_scenario_missing_topology(tmp_path: Path) -> None:
    evt = _write(tmp_path, "net.events", "tick\n")
    missing = tmp_path / "nope.top"
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing, evt)
    _assert_error(info.value, str(missing), None, "no such file")


def test_load_scenario_missing_events(tmp_path: Path) -> None:
    top = _write(tmp_path, "net.top", TOPOLOGY_TEXT)
    missing = tmp_path / "sub" / "nope.events"
    with pytest.raises(ScenarioError) as info:
        load_scenario(top, missing)
    _assert_error(info.value, str(missing), None, "no such file")


def test_load_scenario_directory_instead_of_a_file(tmp_path: Path) -> None:
    evt = _write(tmp_path, "net.events", "tick\n")
    folder = tmp_path / "a.top"
    folder.mkdir()
    with pytest.raises(ScenarioError) as info:
        load_scenario(folder, evt)
    _assert_error(info.value, str(folder), None, "is a directory, not a file")
    top = _write(tmp_path, "net.top", TOPOLOGY_TEXT)
    with pytest.raises(ScenarioError) as info:
        load_scenario(top, tmp_path)
    _assert_error(info.value, str(tmp_path), None, "is a directory, not a file")


def test_load_scenario_non_utf8_bytes(tmp_path: Path) -> None:
    top = tmp_path / "latin1.top"
    top.write_bytes("1\nBanque-\xe9 5\n".encode("latin-1"))
    evt = _write(tmp_path, "net.events", "tick\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(top, evt)
    _assert_error(info.value, str(top), None, "not UTF-8 text (invalid continuation byte)")
    good = _write(tmp_path, "net.top", TOPOLOGY_TEXT)
    bad_events = tmp_path / "bin.events"
    bad_events.write_bytes(b"tick\n\xff\xfe\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(good, bad_events)
    _assert_error(info.value, str(bad_events), None, "not UTF-8 text (invalid start byte)")


def test_load_scenario_accepts_utf8_process_names(tmp_path: Path) -> None:
    top = _write(tmp_path, "net.top", "2\nBanque-é 5\n銀行 3\nBanque-é 銀行\n")
    evt = _write(tmp_path, "net.events", "send Banque-é 銀行 5\n")
    scenario = load_scenario(top, evt)
    assert scenario.topology.processes == ("Banque-é", "銀行")
    assert scenario.events == (Send("Banque-é", "銀行", 5, 1),)


def test_one_snapshot_line_may_name_several_initiators(topology: Topology) -> None:
    events = parse_events("snapshot N1 N2\ntick\nsnapshot N3\n", topology, EVT)
    assert events == (
        Initiate("N1", 0, 1),
        Initiate("N2", 0, 1),
        Tick(1, 2),
        Initiate("N3", 1, 3),
    )
    assert format_events(events) == "snapshot N1 N2\ntick\nsnapshot N3\n"


def test_events_built_in_code_are_checked_too(topology: Topology) -> None:
    with pytest.raises(ScenarioError, match="1 token or more, not -7"):
        Send("N1", "N2", -7)
    with pytest.raises(ScenarioError, match="cannot pay itself"):
        Send("N1", "N1", 1)
    with pytest.raises(ScenarioError, match="1 step or more, not -3"):
        Tick(-3)
    with pytest.raises(ScenarioError, match="whole number >= 0"):
        Initiate("N1", -1)
    with pytest.raises(ScenarioError, match="no channel from N2 to N2x"):
        Scenario(topology, (Send("N2", "N2x", 1),))
    with pytest.raises(ScenarioError, match="unknown process 'N7'"):
        Scenario(topology, (Initiate("N7", 0),))
    with pytest.raises(ValueError, match="the next one is 0"):
        format_events((Initiate("N1", 1),))
