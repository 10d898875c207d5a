"""``rate_limit=``: a source reads at most that many records per second (a token bucket per
subtask, its share of the limit), and the job's output is exactly what it would be without.
The bucket is checked on a clock of the test's own (no test asserts a timing)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline import StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher
from cutline.runtime.task.source_subtask import Pace, ReadSize


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 1_000_000),
    steps=st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 100_000)), max_size=60),
)
def test_the_bucket_never_allows_more_than_the_rate_and_a_burst(rate, steps):
    pace = Pace(rate)
    now, read = 100.0, 0
    start = now
    for pause, wanted in steps:
        now += pause
        allowed = pace.allowed(now)
        taken = min(wanted, allowed)
        if taken > 0:
            pace.took(taken)
            read += taken
        assert read <= rate * (now - start) + pace.burst + 1
        wait = pace.wait()
        assert wait >= 0
        if wait > 0:  # after that long, a step's worth (at least one record) may be read
            assert pace.allowed(now + wait + 1e-9) >= max(1, int(pace.step))


def test_reads_halve_while_slow_and_double_while_quick():
    reads = ReadSize(65_536)
    assert reads.size == 1_024
    reads.took(1_024, 0.001)
    assert reads.size == 2_048
    reads.took(2_048, 0.5)  # a costly chain: smaller reads, so triggers are seen in time
    assert reads.size == 1_024
    for _ in range(20):
        reads.took(reads.size, 0.5)
    assert reads.size == ReadSize.SMALLEST
    for _ in range(40):
        reads.took(reads.size, 0.001)
    assert reads.size == 65_536  # (never above batch_size)


def test_a_rate_limited_job_gives_the_same_output(tmp_path):
    env = StreamEnvironment(2, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    env.from_sequence(0, 3_000, rate_limit=20_000).collect()
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert sorted(r["value"] for r in result.output) == list(range(3_000))


@pytest.mark.parametrize("bad", [0, -5, float("inf"), True, "fast"])
def test_a_rate_limit_must_be_a_positive_number(tmp_path, bad):
    env = StreamEnvironment(2, checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="rate_limit must be a number of records per second"):
        env.from_sequence(0, 10, rate_limit=bad)
