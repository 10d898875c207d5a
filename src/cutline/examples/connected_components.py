"""Connected components of a graph that arrives as a stream of edges: a job with a loop.

Each vertex keeps the smallest vertex id it has heard of (its component's label) and its
neighbours. An edge makes both ends tell each other their label; a vertex whose label
drops tells all its neighbours. Those messages go round the loop of
:meth:`~cutline.api.environment.DataStream.iterate` until no label drops any more; each
drop is published as ``{"vertex": v, "label": l}``. At the end, every vertex's smallest
published label is the smallest vertex id of its component, and with exactly-once
checkpoints every ``(vertex, label)`` pair is published once, however often a worker was
killed on the way.

    from cutline import StreamEnvironment
    from cutline.examples.connected_components import components, edge_stream

    env = StreamEnvironment(2)
    components(edge_stream(env, edges=5_000, vertices=2_000)).collect()
    result = env.execute()
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cutline.api.environment import DataStream, StreamEnvironment
from cutline.runtime.operators import KeyedProcessFunction, ProcessContext

GROUPS = 5
"""The generated graph's vertices fall into this many groups that no edge joins."""


def edge(i: int, vertices: int) -> tuple[int, int]:
    """The ``i``-th generated edge: both ends in the same group (``vertex % GROUPS``)."""
    group = i % GROUPS
    size = vertices // GROUPS
    u = group + GROUPS * ((i * 7919) % size)
    v = group + GROUPS * ((i * 104729 + 13) % size)
    return u, v


def edge_stream(env: StreamEnvironment, *, edges: int, vertices: int) -> DataStream:
    """``edges`` generated edges over ``vertices`` vertices, as ``{"u": .., "v": ..}``."""
    if vertices < GROUPS:
        raise ValueError(f"vertices must be at least {GROUPS}, not {vertices}")
    return env.from_sequence(0, edges).map(_EdgeOf(vertices), name="edge")


class _EdgeOf:
    __name__ = "edge_of"

    def __init__(self, vertices: int) -> None:
        self.vertices = vertices

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        u, v = edge(record["value"], self.vertices)
        return {"u": u, "v": v}


def both_directions(e: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {"kind": "edge", "vertex": e["u"], "other": e["v"]},
        {"kind": "edge", "vertex": e["v"], "other": e["u"]},
    ]


def vertex_of(message: dict[str, Any]) -> int:
    return int(message["vertex"])


class Propagate(KeyedProcessFunction):
    """Per vertex: its label (value state) and its neighbours (map state)."""

    def open(self, ctx: Any) -> None:
        self.label = ctx.value_state("label")
        self.neighbours = ctx.map_state("neighbours")

    def process(self, message: dict[str, Any], ctx: ProcessContext) -> Iterator[dict[str, Any]]:
        vertex = message["vertex"]
        label = self.label.get()
        if message["kind"] == "edge":
            other = message["other"]
            self.neighbours.put(other, True)
            if label is None:
                label = vertex
                self.label.update(label)
                yield {"kind": "out", "vertex": vertex, "label": label}
            yield {"kind": "label", "vertex": other, "label": label}
            return
        offered = message["label"]
        if label is None:  # heard of before its own edge came: its neighbours come with it
            label = min(offered, vertex)
        elif offered < label:
            label = offered
        else:
            return
        self.label.update(label)
        yield {"kind": "out", "vertex": vertex, "label": label}
        for neighbour, _ in self.neighbours.items():
            yield {"kind": "label", "vertex": neighbour, "label": label}


def is_label(message: dict[str, Any]) -> bool:
    return bool(message["kind"] == "label")


def is_output(message: dict[str, Any]) -> bool:
    return bool(message["kind"] == "out")


def as_output(message: dict[str, Any]) -> dict[str, int]:
    return {"vertex": message["vertex"], "label": message["label"]}


def components(edges: DataStream) -> DataStream:
    """The label drops of every vertex, ``{"vertex": v, "label": l}``, as they happen."""

    def body(loop: DataStream) -> tuple[DataStream, DataStream]:
        messages = loop.key_by(vertex_of).process(Propagate(), name="propagate")
        return messages.filter(is_label, name="feedback"), messages.filter(is_output).map(
            as_output, name="label_drops"
        )

    return edges.flat_map(both_directions, name="both_directions").iterate(body, name="loop")


def expected_labels(edges: int, vertices: int) -> dict[int, int]:
    """Every vertex that appears in an edge -> the smallest vertex of its component."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(edges):
        u, v = edge(i, vertices)
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    return {x: find(x) for x in list(parent)}
