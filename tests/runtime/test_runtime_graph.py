"""The job graph and its execution plan: which operators chain, which channels connect the
chains, and the graphs that cannot run."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import pytest

from cutline.api.environment import StreamEnvironment
from cutline.runtime.graph import (
    Chain,
    Edge,
    ExecutionPlan,
    GraphError,
    JobGraph,
    Operator,
    OutputEdge,
    channel_id,
    plan,
    subtask_name,
)


def key_of(record: dict[str, int]) -> int:
    return record["k"]


def graph_of(*specs: tuple[str, Sequence[Edge]]) -> JobGraph:
    """A graph of operators ``(uid, inputs)``, named after their uids, with no logic."""
    graph = JobGraph()
    for uid, inputs in specs:
        graph.add(Operator(uid, f"op({uid})", None, list(inputs)))
    return graph


def layout(execution_plan: ExecutionPlan) -> list[list[str]]:
    """The chains as lists of operator uids, head first."""
    return [[op.uid for op in chain.operators] for chain in execution_plan.chains]


def fwd(upstream: str) -> Edge:
    return Edge(upstream)


def hashed(upstream: str, key: str = "k") -> Edge:
    return Edge(upstream, "hash", key)


def busy_graph() -> JobGraph:
    """Every kind of edge: a chain, fan-outs (forward and hash), a union, a key_by with a
    function, and chaining again after a break.

    ::

        s1 -> m1 -+-> f1 ------------+        +-> sink1
                  +=(hash k)=> agg --+--> u --+
        s2 --------------------------+        +=(hash fn)=> proc -> sink2
    """
    return graph_of(
        ("s1", []),
        ("m1", [fwd("s1")]),
        ("f1", [fwd("m1")]),
        ("agg", [hashed("m1")]),
        ("s2", []),
        ("u", [fwd("f1"), fwd("agg"), fwd("s2")]),
        ("sink1", [fwd("u")]),
        ("proc", [Edge("u", "hash", key_of)]),
        ("sink2", [fwd("proc")]),
    )


# ------------------------------------------------------------------------------- chaining


def test_a_pipeline_of_forward_single_consumer_edges_is_one_chain() -> None:
    graph = graph_of(
        ("src", []), ("map", [fwd("src")]), ("flt", [fwd("map")]), ("out", [fwd("flt")])
    )
    result = plan(graph, 2, 128)
    assert layout(result) == [["src", "map", "flt", "out"]]
    (chain,) = result.chains
    assert chain.uid == "src"
    assert chain.is_source
    assert chain.inputs == ()
    assert chain.outputs == ()
    assert chain.name == "op(src) -> op(map) -> op(flt) -> op(out)"
    assert result.input_channels(chain, 0) == []


def test_a_hash_edge_starts_a_new_chain_even_from_a_single_consumer_upstream() -> None:
    graph = graph_of(
        ("src", []), ("map", [fwd("src")]), ("sum", [hashed("map")]), ("out", [fwd("sum")])
    )
    result = plan(graph, 2, 128)
    assert layout(result) == [["src", "map"], ["sum", "out"]]
    head, keyed = result.chains
    assert head.outputs == (OutputEdge("sum", "hash", "k", "map>sum"),)
    # the keyed chain's input names the upstream *chain* (its head), not the tail operator
    assert keyed.inputs == (Edge("src", "hash", "k"),)
    assert not keyed.is_source
    assert keyed.outputs == ()


def test_fan_out_starts_a_new_chain_for_every_consumer() -> None:
    graph = graph_of(
        ("src", []),
        ("a", [fwd("src")]),
        ("b", [fwd("src")]),
        ("a2", [fwd("a")]),
        ("b2", [fwd("b")]),
    )
    result = plan(graph, 2, 128)
    assert layout(result) == [["src"], ["a", "a2"], ["b", "b2"]]
    assert result.chain("src").outputs == (
        OutputEdge("a", "forward", None, "src>a"),
        OutputEdge("b", "forward", None, "src>b"),
    )


def test_fan_out_to_a_forward_and_a_hash_consumer_chains_neither() -> None:
    graph = graph_of(("src", []), ("a", [fwd("src")]), ("b", [hashed("src")]))
    result = plan(graph, 3, 128)
    assert layout(result) == [["src"], ["a"], ["b"]]
    assert [o.partitioning for o in result.chain("src").outputs] == ["forward", "hash"]


def test_union_starts_a_new_chain_and_what_follows_it_chains_onto_it() -> None:
    graph = graph_of(
        ("s1", []),
        ("s2", []),
        ("u", [fwd("s1"), fwd("s2")]),
        ("m", [fwd("u")]),
        ("out", [fwd("m")]),
    )
    result = plan(graph, 2, 128)
    assert layout(result) == [["s1"], ["s2"], ["u", "m", "out"]]
    assert result.chain("u").inputs == (Edge("s1"), Edge("s2"))
    assert result.chain("s1").outputs == (OutputEdge("u", "forward", None, "s1>u"),)
    assert result.chain("s2").outputs == (OutputEdge("u", "forward", None, "s2>u"),)
    assert result.input_channels(result.chain("u"), 1) == ["s1>u:1>1", "s2>u:1>1"]


def test_a_middle_operator_of_a_chain_is_never_read_from_outside_it() -> None:
    result = plan(busy_graph(), 2, 128)
    assert layout(result) == [
        ["s1", "m1"],
        ["f1"],
        ["agg"],
        ["s2"],
        ["u"],
        ["sink1"],
        ["proc", "sink2"],
    ]
    for chain in result.chains:
        tail = chain.operators[-1].uid
        assert all(out.edge_id.startswith(f"{tail}>") for out in chain.outputs)


def test_the_environment_builds_the_chains_a_user_expects() -> None:
    env = StreamEnvironment(2)
    (
        env.from_sequence(0, 10)
        .map(lambda r: {"key": r["value"] % 3, "value": 1})
        .key_by("key")
        .sum("value")
        .filter(lambda r: r["value"] > 1)
        .collect()
    )
    result = env.plan()
    assert [chain.name for chain in result.chains] == [
        "sequence -> map(lambda)",
        "sum(value) -> filter(lambda) -> collect(collect)",
    ]
    assert result.chains[0].outputs[0].partitioning == "hash"
    assert result.chains[0].outputs[0].key == "key"
    # unnamed operators: ids of their label and a digest of their function and inputs
    source, summed = (chain.uid for chain in result.chains)
    assert re.fullmatch(r"sequence-[0-9a-f]{8}", source)
    assert re.fullmatch(r"sum_value-[0-9a-f]{8}", summed)
    assert result.subtasks() == [f"{source}-0", f"{source}-1", f"{summed}-0", f"{summed}-1"]
    assert result.source_subtasks() == [f"{source}-0", f"{source}-1"]


def test_plan_lists_every_subtask_and_the_source_subtasks() -> None:
    result = plan(busy_graph(), 3, 128)
    heads = ["s1", "f1", "agg", "s2", "u", "sink1", "proc"]
    assert result.subtasks() == [subtask_name(h, i) for h in heads for i in range(3)]
    assert result.source_subtasks() == [subtask_name(h, i) for h in ("s1", "s2") for i in range(3)]
    assert subtask_name("s1", 2) == "s1-2"
    with pytest.raises(KeyError):
        result.chain("m1")  # not a head


# ------------------------------------------------------------------------------- channels


def sent_channels(execution_plan: ExecutionPlan) -> list[tuple[str, str, int]]:
    """Every channel some upstream subtask writes: (channel id, downstream chain, its subtask)."""
    return [
        (channel, out.downstream, target)
        for chain in execution_plan.chains
        for out in chain.outputs
        for index in range(execution_plan.parallelism)
        for channel, target in execution_plan.output_channels(out, index)
    ]


def read_channels(execution_plan: ExecutionPlan) -> list[tuple[str, str, int]]:
    """Every channel some downstream subtask reads: (channel id, its chain, its subtask)."""
    return [
        (channel, chain.uid, index)
        for chain in execution_plan.chains
        for index in range(execution_plan.parallelism)
        for channel in execution_plan.input_channels(chain, index)
    ]


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_every_output_channel_is_exactly_one_input_channel(parallelism: int) -> None:
    result = plan(busy_graph(), parallelism, 128)
    sent, read = sent_channels(result), read_channels(result)
    assert len(set(sent)) == len(sent), "an output channel is listed twice"
    assert len(set(read)) == len(read), "an input channel is listed twice"
    assert Counter(sent) == Counter(read)
    # a channel id is unique in the whole job: it names one writer and one reader
    ids = [channel for channel, _, _ in sent]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_a_channel_id_names_its_edge_its_writer_and_its_reader(parallelism: int) -> None:
    result = plan(busy_graph(), parallelism, 128)
    for chain in result.chains:
        for out in chain.outputs:
            for index in range(parallelism):
                for channel, target in result.output_channels(out, index):
                    assert channel == channel_id(out.edge_id, index, target)
                    assert channel == f"{out.edge_id}:{index}>{target}"
                    assert 0 <= target < parallelism


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_forward_edges_have_one_channel_per_subtask_and_hash_edges_one_per_pair(
    parallelism: int,
) -> None:
    result = plan(busy_graph(), parallelism, 128)
    per_edge = Counter(channel.split(":")[0] for channel, _, _ in sent_channels(result))
    assert per_edge == {
        "m1>f1": parallelism,
        "m1>agg": parallelism**2,
        "f1>u": parallelism,
        "agg>u": parallelism,
        "s2>u": parallelism,
        "u>sink1": parallelism,
        "u>proc": parallelism**2,
    }
    for chain in result.chains:
        for out in chain.outputs:
            for index in range(parallelism):
                targets = [t for _, t in result.output_channels(out, index)]
                expected = [index] if out.partitioning == "forward" else list(range(parallelism))
                assert targets == expected


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_a_subtask_reads_the_channels_of_every_input_of_its_chain(parallelism: int) -> None:
    result = plan(busy_graph(), parallelism, 128)
    for index in range(parallelism):
        assert result.input_channels(result.chain("s1"), index) == []
        assert result.input_channels(result.chain("s2"), index) == []
        assert result.input_channels(result.chain("f1"), index) == [f"m1>f1:{index}>{index}"]
        assert result.input_channels(result.chain("agg"), index) == [
            f"m1>agg:{i}>{index}" for i in range(parallelism)
        ]
        assert result.input_channels(result.chain("u"), index) == [
            f"f1>u:{index}>{index}",
            f"agg>u:{index}>{index}",
            f"s2>u:{index}>{index}",
        ]
        assert result.input_channels(result.chain("sink1"), index) == [f"u>sink1:{index}>{index}"]
        assert result.input_channels(result.chain("proc"), index) == [
            f"u>proc:{i}>{index}" for i in range(parallelism)
        ]
    proc = result.chain("proc")
    assert proc.inputs == (Edge("u", "hash", key_of),)


def test_two_edges_from_one_upstream_get_distinct_channels_or_are_rejected() -> None:
    graph = graph_of(("a", []))
    try:
        graph.add(Operator("u", "union", None, [fwd("a"), fwd("a")]))
        result = plan(graph, 2, 128)
    except GraphError:
        return  # rejecting the graph is a fine answer too
    channels = result.input_channels(result.chain("u"), 0)
    assert len(set(channels)) == len(channels) == 2


# ---------------------------------------------------------------------------- bad graphs


def test_a_graph_without_operators_cannot_be_planned() -> None:
    with pytest.raises(GraphError, match="no operators"):
        plan(JobGraph(), 1, 128)


def test_a_graph_without_a_source_cannot_be_planned() -> None:
    graph = JobGraph()
    # add() cannot build such a graph (inputs must exist first): put it together by hand
    graph.operators["a"] = Operator("a", "op(a)", None, [fwd("b")])
    graph.operators["b"] = Operator("b", "op(b)", None, [fwd("a")])
    with pytest.raises(GraphError, match="no source"):
        plan(graph, 1, 128)


def test_two_operators_with_one_uid_are_rejected() -> None:
    graph = graph_of(("src", []))
    with pytest.raises(GraphError, match="two operators have the id 'src'"):
        graph.add(Operator("src", "again", None))
    assert list(graph.operators) == ["src"]


@pytest.mark.parametrize(
    "uid", ["", "has space", "a/b", "../up", "-lead", "_lead", ".hidden", "ünï", "a:b", "a>b"]
)
def test_operator_uids_with_bad_characters_are_rejected(uid: str) -> None:
    with pytest.raises(GraphError, match="must be letters, digits"):
        JobGraph().add(Operator(uid, "op", None))


@pytest.mark.parametrize("uid", ["a", "1-sequence", "Map_2.v-3", "0"])
def test_operator_uids_of_letters_digits_and_separators_are_accepted(uid: str) -> None:
    graph = JobGraph()
    graph.add(Operator(uid, "op", None))
    assert list(graph.operators) == [uid]


def test_an_edge_from_an_unknown_operator_is_rejected() -> None:
    with pytest.raises(GraphError, match="reads from unknown operator 'nowhere'"):
        graph_of(("src", []), ("m", [fwd("nowhere")]))


def test_an_edge_with_an_unknown_partitioning_is_rejected() -> None:
    with pytest.raises(GraphError, match="unknown partitioning 'round_robin'"):
        Edge("src", "round_robin")


@pytest.mark.parametrize(("parallelism", "max_parallelism"), [(5, 4), (129, 128), (2, 1), (0, 4)])
def test_parallelism_outside_one_to_max_parallelism_is_rejected(
    parallelism: int, max_parallelism: int
) -> None:
    with pytest.raises(GraphError, match=f"parallelism {parallelism} must be between 1 and"):
        plan(graph_of(("src", [])), parallelism, max_parallelism)


def test_parallelism_equal_to_max_parallelism_is_fine() -> None:
    result = plan(graph_of(("src", []), ("k", [hashed("src")])), 4, 4)
    assert result.parallelism == result.max_parallelism == 4
    assert len(read_channels(result)) == 16


def test_graph_error_is_a_value_error() -> None:
    assert issubclass(GraphError, ValueError)
    assert isinstance(plan(graph_of(("src", [])), 1, 1).chains[0], Chain)


def test_a_two_input_operator_knows_the_port_of_each_input_channel() -> None:
    """A stream connected with a broadcast one: port 0 forward (one channel per subtask),
    port 1 broadcast (every upstream subtask to every downstream one); a self-join reads one
    operator on both ports, over two edges of their own."""
    graph = graph_of(
        ("a", []),
        ("b", []),
        ("both", [Edge("a"), Edge("b", "broadcast", port=1)]),
        ("self", [Edge("a", "hash", "k"), Edge("a", "hash", "k", port=1)]),
    )
    p = plan(graph, 3, 128)
    both = p.chain("both")
    assert p.input_ports(both, 1) == {
        "a>both:1>1": 0,
        "b>both/1:0>1": 1,
        "b>both/1:1>1": 1,
        "b>both/1:2>1": 1,
    }
    outputs = {out.downstream: out for out in p.chain("b").outputs}
    assert p.output_channels(outputs["both"], 2) == [(f"b>both/1:2>{j}", j) for j in range(3)]
    ports = p.input_ports(p.chain("self"), 0)
    assert sorted(ports.values()) == [0, 0, 0, 1, 1, 1] and len(set(ports)) == 6
    with pytest.raises(GraphError, match=r"reads the same operator twice: \['a', 'a'\]"):
        graph.add(Operator("twice", "op(twice)", None, [Edge("a"), Edge("a")]))
