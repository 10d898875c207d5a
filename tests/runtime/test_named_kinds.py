"""The closed sets the runtime dispatches on are enums, made once from the names a user or
the API gives (``state_backend="disk"``, ``checkpointing="unaligned"``, ``value_format="raw"``):
a name that is none of them is refused there, naming those that work; what is made compares
equal to its name, so checks and files that hold the name are unchanged."""

from __future__ import annotations

import json

import pytest

from cutline.connectors.kafka.values import Keys, ValueFormat, Values
from cutline.runtime.graph import Edge, GraphError, Partitioning
from cutline.runtime.state.config import Backend, StateConfig
from cutline.runtime.state.factory import new_backend
from cutline.runtime.state.memory import MemoryStateBackend
from cutline.runtime.state.rocksdb import DiskStateBackend
from cutline.runtime.task.launch import BarrierHandling, Checkpointing


def test_a_state_backend_is_made_from_its_name(tmp_path: object) -> None:
    config = StateConfig(backend="disk")
    assert config.backend is Backend.DISK and config.backend == "disk"
    assert json.dumps({"backend": config.backend}) == '{"backend": "disk"}'
    with pytest.raises(
        ValueError, match="state_backend must be one of 'memory', 'disk', not 'ssd'"
    ):
        StateConfig(backend="ssd")
    memory = new_backend(StateConfig())
    disk = new_backend(StateConfig(Backend.DISK, local_dir=str(tmp_path)))
    try:
        assert type(memory) is MemoryStateBackend and type(disk) is DiskStateBackend
        assert memory.kind is Backend.MEMORY and disk.kind is Backend.DISK
    finally:
        memory.close()
        disk.close()


def test_a_checkpointing_mode_is_made_from_its_name() -> None:
    handling = BarrierHandling("unaligned")
    assert handling.mode is Checkpointing.UNALIGNED and handling.unaligned
    assert BarrierHandling().mode is Checkpointing.ALIGNED
    with pytest.raises(ValueError, match="checkpointing must be one of 'aligned', 'unaligned'"):
        BarrierHandling("exactly_once")
    with pytest.raises(ValueError, match="alignment_timeout applies to aligned checkpoints only"):
        BarrierHandling(Checkpointing.AT_LEAST_ONCE, 1.0)


def test_an_edge_s_partitioning_is_made_from_its_name() -> None:
    edge = Edge("src", "hash", "k")
    assert edge.partitioning is Partitioning.HASH and edge == Edge("src", Partitioning.HASH, "k")
    assert Edge("src").partitioning is Partitioning.FORWARD
    with pytest.raises(GraphError, match="unknown partitioning 'round_robin'"):
        Edge("src", "round_robin")


def test_kafka_s_value_and_key_formats_are_made_from_their_names() -> None:
    value = ValueFormat("raw", key_format="raw")
    assert value.value_format is Values.RAW and value.key_format is Keys.RAW
    assert value.value_schema() is not None and value.value_schema().names == ["value"]

    def deserializer(data: bytes) -> dict[str, object]:
        return {"n": len(data)}

    assert ValueFormat(deserializer).value_format is deserializer
    with pytest.raises(ValueError, match="value_format must be one of json, avro, raw, string"):
        ValueFormat("protobuf")
    with pytest.raises(ValueError, match="key_format must be 'string' or 'raw', not 'int'"):
        ValueFormat("json", key_format="int")
