"""Random scenarios: strongly connected graphs, payments and snapshots.

Used by the property tests and the B5 benchmark. Everything is drawn from a
``random.Random`` the caller seeds, so a scenario is reproducible from its seed.
"""

from __future__ import annotations

import random

from cutline.sim.scenario import Channel, Event, Initiate, Scenario, Send, Tick, Topology


def strongly_connected_topology(
    rng: random.Random, n: int, *, extra_edges: int | None = None, tokens: int = 100
) -> Topology:
    """``n`` processes on a random directed cycle plus ``extra_edges`` random channels.

    The cycle makes every process reachable from every other one. Each process
    starts with ``tokens`` tokens.
    """
    if n < 2:
        raise ValueError("a strongly connected graph of processes needs at least 2 of them")
    names = [f"P{i}" for i in range(n)]
    order = names[:]
    rng.shuffle(order)
    channels: list[Channel] = [(order[i], order[(i + 1) % n]) for i in range(n)]
    seen = set(channels)
    possible = n * (n - 1)
    if extra_edges is None:
        extra_edges = rng.randint(0, min(possible - n, 2 * n))
    extra_edges = min(extra_edges, possible - len(seen))
    while extra_edges > 0:
        src, dst = rng.sample(names, 2)
        if (src, dst) not in seen:
            seen.add((src, dst))
            channels.append((src, dst))
            extra_edges -= 1
    return Topology(tuple(names), dict.fromkeys(names, tokens), tuple(channels))


def random_script(
    rng: random.Random,
    topology: Topology,
    *,
    payments: int,
    snapshots: int,
    initiators: int = 1,
    max_tick: int = 3,
    max_amount: int = 5,
) -> tuple[Event, ...]:
    """A script of ``payments`` random payments, ``snapshots`` snapshots and ticks.

    Each snapshot is initiated by 1 to ``initiators`` distinct processes, at
    moments spread over the script, so that snapshots overlap each other and
    several initiators of one id race each other. Amounts are kept within the
    payer's balance *as debited so far*, which is always safe: credits only
    ever add to it.
    """
    debit_budget = dict(topology.balances)
    outputs: dict[str, list[Channel]] = {}
    for channel in topology.channels:
        outputs.setdefault(channel[0], []).append(channel)
    payers = sorted(outputs)
    n_slots = payments + snapshots * initiators
    events: list[Event] = []
    initiations: list[tuple[int, str, int]] = []
    for snapshot_id in range(snapshots):
        count = rng.randint(1, min(initiators, len(topology.processes)))
        for pid in rng.sample(list(topology.processes), count):
            initiations.append((rng.randint(0, n_slots), pid, snapshot_id))
    initiations.sort(key=lambda item: item[0])
    pending = list(initiations)
    for slot in range(payments + 1):
        while pending and pending[0][0] <= slot:
            _, pid, snapshot_id = pending.pop(0)
            events.append(Initiate(pid, snapshot_id))
        if slot == payments:
            break
        if rng.random() < 0.35:
            events.append(Tick(rng.randint(1, max_tick)))
        src = rng.choice(payers)
        channel = rng.choice(outputs[src])
        if debit_budget[src] <= 0:
            continue
        amount = rng.randint(1, min(max_amount, debit_budget[src]))
        debit_budget[src] -= amount
        events.append(Send(channel[0], channel[1], amount))
    for _, pid, snapshot_id in pending:
        events.append(Initiate(pid, snapshot_id))
    return tuple(events)


def random_scenario(
    seed: int,
    *,
    processes: tuple[int, int] = (2, 12),
    payments: tuple[int, int] = (0, 40),
    snapshots: tuple[int, int] = (1, 4),
    initiators: int = 3,
) -> Scenario:
    """A whole random scenario from one seed."""
    rng = random.Random(seed)
    topology = strongly_connected_topology(rng, rng.randint(*processes))
    events = random_script(
        rng,
        topology,
        payments=rng.randint(*payments),
        snapshots=rng.randint(*snapshots),
        initiators=initiators,
    )
    return Scenario(topology, events, f"<random scenario {seed}>")
