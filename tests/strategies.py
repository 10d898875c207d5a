"""Hypothesis strategies for scenarios: random strongly connected graphs, payments, snapshots."""

from __future__ import annotations

from hypothesis import strategies as st

from cutline.sim.scenario import Event, Initiate, Scenario, Send, Tick, Topology


@st.composite
def strongly_connected_topologies(
    draw: st.DrawFn, min_processes: int = 2, max_processes: int = 12
) -> Topology:
    """A directed cycle through every process (so every one reaches every other) plus extra
    random channels."""
    n = draw(st.integers(min_processes, max_processes))
    names = [f"P{i}" for i in range(n)]
    order = draw(st.permutations(names))
    channels = [(order[i], order[(i + 1) % n]) for i in range(n)]
    extra = draw(
        st.lists(
            st.tuples(st.sampled_from(names), st.sampled_from(names)).filter(
                lambda c: c[0] != c[1]
            ),
            max_size=2 * n,
        )
    )
    for channel in extra:
        if channel not in channels:
            channels.append(channel)
    balances = {p: draw(st.integers(0, 20)) for p in names}
    return Topology(tuple(names), balances, tuple(channels))


@st.composite
def scenarios(
    draw: st.DrawFn,
    min_processes: int = 2,
    max_processes: int = 12,
    max_snapshots: int = 4,
    max_payments: int = 40,
) -> Scenario:
    """A topology and a script: payments within the payer's balance, ticks, and 1 to
    ``max_snapshots`` snapshots, some initiated by several processes at once or at different
    moments, some overlapping each other."""
    topology = draw(strongly_connected_topologies(min_processes, max_processes))
    outputs: dict[str, list[tuple[str, str]]] = {}
    for channel in topology.channels:
        outputs.setdefault(channel[0], []).append(channel)
    budget = dict(topology.balances)
    events: list[Event] = []
    n_snapshots = draw(st.integers(1, max_snapshots))
    initiations = draw(
        st.lists(
            st.tuples(st.integers(0, n_snapshots - 1), st.sampled_from(topology.processes)),
            min_size=n_snapshots,
            max_size=3 * n_snapshots,
        )
    )
    # every id is initiated at least once
    for s in range(n_snapshots):
        if all(i != s for i, _ in initiations):
            initiations.append((s, draw(st.sampled_from(topology.processes))))
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("send"), st.sampled_from(topology.channels), st.integers(1, 5)),
                st.tuples(st.just("tick"), st.integers(1, 4), st.just(0)),
            ),
            max_size=max_payments,
        )
    )
    positions = [draw(st.integers(0, len(steps))) for _ in initiations]
    plan: list[tuple[int, int, Event]] = []
    for k, step in enumerate(steps):
        kind, arg, amount = step
        if kind == "tick":
            plan.append((k, 1, Tick(arg)))
        else:
            src, dst = arg
            amount = min(amount, budget[src])
            if amount > 0:
                budget[src] -= amount
                plan.append((k, 1, Send(src, dst, amount)))
    for (snapshot_id, pid), pos in zip(initiations, positions, strict=True):
        plan.append((pos, 0, Initiate(pid, snapshot_id)))
    plan.sort(key=lambda item: (item[0], item[1]))
    events = [e for _, _, e in plan]
    return Scenario(topology, tuple(events), "<hypothesis>")
