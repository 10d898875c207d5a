"""The channel wire format: frames survive any split of the byte stream; bad streams are refused."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.network.wire import (
    Barrier,
    EndOfInput,
    Frame,
    FrameDecoder,
    Hello,
    Records,
    RefusedConnectionError,
    Watermark,
    WatermarkStatus,
    WireError,
    encode,
)

TOKEN = b"secret-of-this-job"


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({"key": [f"k{i % 7}" for i in range(n)], "value": list(range(n))})


frames = st.lists(
    st.one_of(
        st.builds(
            Barrier,
            st.integers(0, 2**63),
            st.booleans(),
            st.booleans(),
            st.booleans(),
            st.none() | st.integers(0, 2**62),
        ),
        st.lists(st.one_of(st.integers(), st.text(), st.none()), max_size=5).map(Records),
        st.integers(0, 50).map(lambda n: Records(batch(n))),
        st.integers(-(2**63), 2**63 - 1).map(Watermark),
        st.booleans().map(WatermarkStatus),
    ),
    max_size=12,
).map(lambda body: [Hello("src-0->sum-1", 3, TOKEN), *body, EndOfInput()])


def same(a: Frame, b: Frame) -> bool:
    if isinstance(a, Records) and isinstance(b, Records):
        if isinstance(a.batch, pa.RecordBatch):
            return isinstance(b.batch, pa.RecordBatch) and a.batch.equals(b.batch)
        return a.batch == b.batch
    return a == b


@settings(max_examples=200)
@given(stream=frames, cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_frames_survive_any_split_of_the_stream(stream: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode(f) for f in stream)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    decoder = FrameDecoder(token=TOKEN, generation=3)
    got: list[Frame] = []
    for a, b in itertools.pairwise(points):
        got += decoder.feed(data[a:b])
    assert decoder.pending_bytes == 0
    assert len(got) == len(stream)
    assert all(same(a, b) for a, b in zip(got, stream, strict=True))


def test_columnar_batches_keep_their_schema() -> None:
    decoder = FrameDecoder()
    (hello, records) = decoder.feed(encode(Hello("c", 0)) + encode(Records(batch(5))))
    assert hello == Hello("c", 0, b"")
    assert isinstance(records, Records)
    assert isinstance(records.batch, pa.RecordBatch)
    assert records.batch.schema.names == ["key", "value"]
    assert len(records) == 5


def test_a_stale_generation_is_refused_before_any_record_is_read() -> None:
    data = encode(Hello("c", 2, TOKEN)) + encode(Records([1, 2]))
    with pytest.raises(
        RefusedConnectionError, match="generation 2 of the job, this is generation 3"
    ):
        FrameDecoder(token=TOKEN, generation=3).feed(data)


def test_another_jobs_token_is_refused_before_any_record_is_unpickled() -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (pytest.fail, ("a record was unpickled for a refused peer",))

    data = encode(Hello("c", 3, b"guess")) + encode(Records([Boom()]))
    with pytest.raises(RefusedConnectionError, match="token is not this job's"):
        FrameDecoder(token=TOKEN, generation=3).feed(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"HTTP/1.1 200 OK\r\n", "does not start like a cutline channel"),
        (b"CUTL\x09" + b"\x00" * 9, "protocol version 9"),
        (b"CUTL\x01" + encode(Barrier(1)), "first frame of a channel must be its hello"),
        (encode(Hello("c", 0)) + encode(Hello("c", 0))[5:], "a second hello"),
        (encode(Hello("c", 0)) + b"\x63\x00\x00\x00\x00\x00", "unknown frame kind 99"),
        (encode(Hello("c", 0)) + b"\x03\x00\x00\x00\x00\x02ab", "a checkpoint id and its base"),
        (encode(Hello("c", 0)) + b"\x02\x00\xff\xff\xff\xff", "more than"),
        (encode(Hello("c", 0)) + b"\x02\x00\x00\x00\x00\x03abc", "cannot be read"),
        (encode(Hello("c", 0)) + b"\x02\x01\x00\x00\x00\x03abc", "cannot be read"),
    ],
)
def test_bad_streams_are_refused_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        FrameDecoder().feed(data)


def test_a_pickled_frame_must_hold_a_list() -> None:
    import pickle

    payload = pickle.dumps({"not": "a list"})
    data = encode(Hello("c", 0)) + b"\x02\x00" + len(payload).to_bytes(4, "big") + payload
    with pytest.raises(WireError, match="does not hold a list"):
        FrameDecoder().feed(data)
