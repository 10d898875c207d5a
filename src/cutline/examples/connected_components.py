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

Run it with ``python -m cutline.examples.connected_components [--edges N] [--vertices N]``
(local Spark): it runs that job over a random graph (:func:`random_edge`), prints the
components it found, and checks them against a union-find over the same edges (exit
status 0 when they are right and every label drop was published once).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from cutline.api.environment import DataStream, StreamEnvironment
from cutline.runtime.keyed_operators import KeyedProcessFunction, ProcessContext

GROUPS = 5
"""The generated graph's vertices fall into this many groups that no edge joins."""


def edge(i: int, vertices: int) -> tuple[int, int]:
    """The ``i``-th generated edge: both ends in the same group (``vertex % GROUPS``)."""
    group = i % GROUPS
    size = vertices // GROUPS
    u = group + GROUPS * ((i * 7919) % size)
    v = group + GROUPS * ((i * 104729 + 13) % size)
    return u, v


def _mix(x: int) -> int:
    """A 32-bit integer hash (deterministic, so that every run generates the same graph)."""
    x &= 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def random_edge(i: int, vertices: int) -> tuple[int, int]:
    """The ``i``-th edge of a random graph: both ends in the same group, drawn by a hash. With
    more edges than vertices, each group is mostly one large component, whose labels take
    several rounds of the loop to settle (:func:`edge` gives components of two vertices)."""
    group = i % GROUPS
    size = vertices // GROUPS
    return group + GROUPS * (_mix(2 * i) % size), group + GROUPS * (_mix(2 * i + 1) % size)


EdgeOf = Callable[[int, int], tuple[int, int]]
"""A generator of edges: ``(i, vertices) -> (u, v)``, as :func:`edge` and :func:`random_edge`."""


def edge_stream(
    env: StreamEnvironment, *, edges: int, vertices: int, edge_of: EdgeOf = edge
) -> DataStream:
    """``edges`` generated edges over ``vertices`` vertices, as ``{"u": .., "v": ..}``."""
    if vertices < GROUPS:
        raise ValueError(f"vertices must be at least {GROUPS}, not {vertices}")
    return env.from_sequence(0, edges).map(_EdgeOf(vertices, edge_of), name="edge")


class _EdgeOf:
    __name__ = "edge_of"

    def __init__(self, vertices: int, edge_of: EdgeOf = edge) -> None:
        self.vertices = vertices
        self.edge_of = edge_of

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        u, v = self.edge_of(record["value"], self.vertices)
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


def expected_labels(edges: int, vertices: int, edge_of: EdgeOf = edge) -> dict[int, int]:
    """Every vertex that appears in an edge -> the smallest vertex of its component."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(edges):
        u, v = edge_of(i, vertices)
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    return {x: find(x) for x in list(parent)}


def final_labels(output: list[dict[str, int]]) -> dict[int, int]:
    """Every vertex -> the smallest label published for it (its component's label)."""
    labels: dict[int, int] = {}
    for drop in output:
        vertex, label = drop["vertex"], drop["label"]
        labels[vertex] = min(label, labels.get(vertex, label))
    return labels


def main(argv: list[str] | None = None) -> int:
    """Run the job on local Spark, print what it found and whether it is right."""
    parser = argparse.ArgumentParser(
        prog="python -m cutline.examples.connected_components",
        description="Connected components of a stream of edges, in a loop, on local Spark.",
    )
    parser.add_argument("--edges", type=int, default=1_500, help="edges (default 1500)")
    parser.add_argument("--vertices", type=int, default=1_000, help="vertices (default 1000)")
    parser.add_argument("--parallelism", type=int, default=2, help="subtasks (default 2)")
    args = parser.parse_args(argv)
    if args.vertices < GROUPS or args.edges < 1 or args.parallelism < 1:
        parser.error(f"--vertices must be at least {GROUPS}, --edges and --parallelism at least 1")

    from cutline.spark.launcher import local_session

    spark = local_session(args.parallelism)
    with tempfile.TemporaryDirectory(prefix="components-") as folder:
        env = StreamEnvironment(
            args.parallelism, checkpoint_interval="500ms", checkpoint_dir=folder
        )
        edges = edge_stream(env, edges=args.edges, vertices=args.vertices, edge_of=random_edge)
        components(edges).collect()
        result = env.execute(spark)

    labels = final_labels(result.output)
    sizes = Counter(labels.values())
    checkpoints, restarts = len(result.checkpoints), len(result.restarts)
    print(
        f"{args.edges:,} edges over {len(labels):,} vertices: {len(sizes):,} connected "
        f"component{'s' if len(sizes) != 1 else ''} ({checkpoints} "
        f"checkpoint{'s' if checkpoints != 1 else ''}, {restarts} "
        f"restart{'s' if restarts != 1 else ''})"
    )
    for label, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:5]:
        print(f"  the component of vertex {label}: {size:,} vertices")
    if len(sizes) > 5:
        print(f"  ... and {len(sizes) - 5:,} more")
    drops = Counter((drop["vertex"], drop["label"]) for drop in result.output)
    once = all(n == 1 for n in drops.values())
    right = labels == expected_labels(args.edges, args.vertices, random_edge)
    print(f"{len(result.output):,} label drops published, each (vertex, label) once: {once}")
    print(
        "every vertex labelled with the smallest vertex of its component (as a union-find "
        f"over the same edges says): {right}"
    )
    return 0 if once and right else 1


if __name__ == "__main__":
    sys.exit(main())
