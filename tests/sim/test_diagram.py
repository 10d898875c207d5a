"""Space-time diagrams: files, their content and their determinism."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from cutline.sim.diagram import _layout, diagram_figure, draw_diagram
from cutline.sim.generate import random_scenario
from cutline.sim.log import EventKind, SimRun
from cutline.sim.scenario import scenario_from_text
from cutline.sim.simulator import SimConfig, simulate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"

TOPOLOGY = """\
3
N1 10
N2 5
N3 5
N1 N2
N2 N3
N3 N1
N2 N1
"""

# two snapshots, initiated by different processes, that overlap in time
EVENTS = """\
send N1 N2 3
snapshot N1
send N2 N3 2
tick
send N3 N1 1
snapshot N3
send N2 N1 2
tick 2
send N1 N2 1
tick
"""


@pytest.fixture(scope="module")
def small_run() -> SimRun:
    return simulate(scenario_from_text(TOPOLOGY, EVENTS))


def gids(fig: Figure) -> list[str]:
    return [str(a.get_gid()) for a in fig.findobj() if a.get_gid() is not None]


def svg_groups(root: ET.Element) -> dict[str, ET.Element]:
    return {g.attrib["id"]: g for g in root.iter(f"{SVG_NS}g") if "id" in g.attrib}


def svg_texts(element: ET.Element) -> Iterator[str]:
    for text in element.iter(f"{SVG_NS}text"):
        yield "".join(text.itertext()).strip()


def marker_gids(fig: Figure) -> list[str]:
    return [g for g in gids(fig) if g.startswith("marker-")]


def test_small_run_has_two_concurrent_snapshots(small_run: SimRun) -> None:
    # the premise of the tests below: both snapshots are in progress at once
    records = {
        s: [e.time for e in small_run.log if e.kind is EventKind.RECORD and e.snapshot == s]
        for s in (0, 1)
    }
    assert set(small_run.snapshots) == {0, 1}
    assert all(small_run.snapshots[s].complete for s in (0, 1))
    assert min(records[1]) < max(records[0])


def test_png_file(small_run: SimRun, tmp_path: Path) -> None:
    path = tmp_path / "run.png"
    draw_diagram(small_run, path)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000


def test_png_accepts_a_str_path_and_an_upper_case_suffix(small_run: SimRun, tmp_path: Path) -> None:
    path = tmp_path / "RUN.PNG"
    draw_diagram(small_run, str(path))
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_svg_names_every_process_and_snapshot(small_run: SimRun, tmp_path: Path) -> None:
    path = tmp_path / "run.svg"
    draw_diagram(small_run, path, title="two snapshots")
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG_NS}svg"
    texts = list(svg_texts(root))
    groups = svg_groups(root)
    for p in small_run.scenario.topology.processes:
        assert texts.count(p) == 1
        assert list(svg_texts(groups[f"process-{p}"])) == [p]
        assert f"process-line-{p}" in groups
    for s in small_run.snapshots:
        assert texts.count(f"snapshot {s}") == 1
        assert f"cut-{s}" in groups
    assert "two snapshots" in texts
    payments = [e.message for e in small_run.log if e.kind is EventKind.SEND]
    assert payments
    for message in payments:
        assert f"payment-{message}" in groups
    markers = [g for g in groups if g.startswith("marker-")]
    assert len(markers) == sum(1 for e in small_run.log if e.kind is EventKind.MARKER_DELIVER)


def test_svg_is_byte_identical_for_the_same_run(small_run: SimRun, tmp_path: Path) -> None:
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    draw_diagram(small_run, first)
    draw_diagram(small_run, second)
    assert first.read_bytes() == second.read_bytes()
    # and for the same run simulated again
    again = simulate(scenario_from_text(TOPOLOGY, EVENTS))
    third = tmp_path / "c.svg"
    draw_diagram(again, third)
    assert third.read_bytes() == first.read_bytes()


def test_png_is_byte_identical_for_the_same_run(small_run: SimRun, tmp_path: Path) -> None:
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    draw_diagram(small_run, first)
    draw_diagram(small_run, second)
    assert first.read_bytes() == second.read_bytes()


def test_drawing_from_threads_gives_the_same_files(tmp_path: Path) -> None:
    runs = [simulate(random_scenario(seed, processes=(3, 6))) for seed in range(4)]

    def draw(job: tuple[int, int]) -> bytes:
        index, copy = job
        path = tmp_path / f"run{index}-{copy}.svg"
        draw_diagram(runs[index], path)
        return path.read_bytes()

    jobs = [(index, copy) for copy in range(2) for index in range(len(runs))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = dict(zip(jobs, pool.map(draw, jobs), strict=True))
    for index in range(len(runs)):
        assert outputs[index, 0] == outputs[index, 1]
        ET.fromstring(outputs[index, 0])


def test_twelve_processes(tmp_path: Path) -> None:
    scenario = random_scenario(3, processes=(12, 12), payments=(40, 40), snapshots=(3, 3))
    run = simulate(scenario)
    assert len(run.scenario.topology.processes) == 12
    png, svg = tmp_path / "big.png", tmp_path / "big.svg"
    draw_diagram(run, png)
    draw_diagram(run, svg)
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    texts = list(svg_texts(ET.parse(svg).getroot()))
    for p in run.scenario.topology.processes:
        assert texts.count(p) == 1
    for s in run.snapshots:
        assert texts.count(f"snapshot {s}") == 1
    fig = diagram_figure(run)
    width, height = fig.get_size_inches()
    assert width <= 40 and height >= 12


def test_long_run_is_capped_in_width() -> None:
    run = simulate(random_scenario(5, processes=(12, 12), payments=(200, 200), snapshots=(2, 2)))
    assert len(run.log) > 300
    width, _ = diagram_figure(run).get_size_inches()
    assert width <= 40


@pytest.mark.parametrize("name", ["run.pdf", "run.jpg", "run", "run.svg.gz"])
def test_unknown_suffix(small_run: SimRun, tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=r"\.png, \.svg") as info:
        draw_diagram(small_run, tmp_path / name)
    suffix = Path(name).suffix
    assert (repr(suffix) if suffix else "without a suffix") in str(info.value)
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("seed", range(6))
def test_one_marker_arrow_per_marker_delivery(seed: int) -> None:
    run = simulate(random_scenario(seed))
    fig = diagram_figure(run)
    delivered = [e for e in run.log if e.kind is EventKind.MARKER_DELIVER]
    found = marker_gids(fig)
    assert len(found) == len(delivered)
    assert len(set(found)) == len(found)
    expected = {
        f"marker-{e.snapshot}-{e.channel[0]}-{e.channel[1]}" for e in delivered if e.channel
    }
    assert set(found) == expected
    payments = [g for g in gids(fig) if g.startswith("payment-") and "label" not in g]
    assert len(payments) == sum(1 for e in run.log if e.kind is EventKind.DELIVER)
    cuts = [g for g in gids(fig) if g.startswith("cut-")]
    assert sorted(cuts) == sorted(f"cut-{s}" for s in run.snapshots)


def test_channel_state_is_highlighted(small_run: SimRun) -> None:
    found = {g for g in gids(diagram_figure(small_run)) if g.startswith("recorded-")}
    expected = {
        f"recorded-{s}-{payment.id}"
        for s, snap in small_run.snapshots.items()
        for _, payment in snap.messages
    }
    assert expected  # the scenario records some payments in channel state
    assert found == expected


def test_cut_goes_through_the_record_entries(small_run: SimRun) -> None:
    fig = diagram_figure(small_run)
    ax = fig.axes[0]
    processes = small_run.scenario.topology.processes
    for s in small_run.snapshots:
        (cut,) = [line for line in ax.get_lines() if line.get_gid() == f"cut-{s}"]
        xs: list[float] = np.asarray(cut.get_xdata(), dtype=float).tolist()
        ys: list[float] = np.asarray(cut.get_ydata(), dtype=float).tolist()
        recorded = {
            e.process: e.time
            for e in small_run.log
            if e.kind is EventKind.RECORD and e.snapshot == s
        }
        assert len(xs) == len(processes)
        # top to bottom in topology order, each point inside its step
        assert ys == sorted(ys, reverse=True)
        for p, x, y in zip(processes, xs, ys, strict=True):
            assert y == len(processes) - 1 - processes.index(p)
            assert recorded[p] < x < recorded[p] + 1


def test_events_sharing_a_step_do_not_overlap() -> None:
    run = simulate(random_scenario(0))
    lay = _layout(run)
    places = [(x, lay.y[run.log[i].process]) for i, x in lay.x.items()]
    assert len(set(places)) == len(places)
    for i, x in lay.x.items():
        assert run.log[i].time < x < run.log[i].time + 1
    # within a process, the log's order is kept
    for p in run.scenario.topology.processes:
        xs = [x for i, x in sorted(lay.x.items()) if run.log[i].process == p]
        assert xs == sorted(xs)


def test_undelivered_and_duplicate_markers_are_handled(small_run: SimRun) -> None:
    log = list(small_run.log)
    # drop the first marker delivery: its marker is then never delivered
    first = next(i for i, e in enumerate(log) if e.kind is EventKind.MARKER_DELIVER)
    dropped = log[first]
    del log[first]
    # and send a second snapshot-0 marker on a channel, delivered twice at the end
    extra = next(e for e in log if e.kind is EventKind.MARKER_DELIVER and e.snapshot == 0)
    assert extra.channel is not None
    end = small_run.end_time + 1
    log.append(
        dataclasses.replace(extra, time=end, kind=EventKind.MARKER_SEND, process=extra.channel[0])
    )
    log.append(dataclasses.replace(extra, time=end + 1))
    # and a delivery of a marker nobody sent
    log.append(dataclasses.replace(extra, time=end + 2, snapshot=99))
    run = dataclasses.replace(small_run, log=log, end_time=end + 2)
    found = marker_gids(diagram_figure(run))
    delivered = sum(1 for e in small_run.log if e.kind is EventKind.MARKER_DELIVER)
    assert len(found) == delivered  # one lost, one extra, the stray one skipped
    assert f"marker-0-{extra.channel[0]}-{extra.channel[1]}-1" in found
    assert not any(g.startswith("marker-99-") for g in found)
    assert dropped.channel is not None
    src, dst = dropped.channel
    assert f"marker-{dropped.snapshot}-{src}-{dst}" not in found


def test_runs_without_snapshots_or_log(tmp_path: Path) -> None:
    scenario = scenario_from_text(TOPOLOGY, EVENTS)
    baseline = simulate(scenario, SimConfig(snapshots=False))
    fig = diagram_figure(baseline)
    assert not [g for g in gids(fig) if g.startswith(("marker-", "cut-"))]
    draw_diagram(baseline, tmp_path / "baseline.svg")
    no_log = simulate(scenario, SimConfig(keep_log=False))
    assert no_log.log == []
    draw_diagram(no_log, tmp_path / "no-log.svg")
    texts = list(svg_texts(ET.parse(tmp_path / "no-log.svg").getroot()))
    assert texts.count("snapshot 0") == 1


def test_few_payments_are_labelled(small_run: SimRun) -> None:
    texts = [t.get_text() for t in diagram_figure(small_run).axes[0].texts]
    amounts = [e.amount for e in small_run.log if e.kind is EventKind.SEND]
    assert sorted(t for t in texts if t.startswith("token(")) == sorted(
        f"token({a})" for a in amounts
    )
