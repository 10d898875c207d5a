"""The frame sizer (buffer debloating) against simulated receivers: where the receiver's cost
grows with the records, waiting frames shrink to about a fraction of a second of its work (so a
barrier waits behind little); where the cost is per frame, they do not shrink for good, and the
receiver's pace stays (cutting never costs throughput)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cutline.runtime.network.frames import FrameSizer


def simulate(
    per_frame: float, per_record: float, batch: int, seconds: float = 60.0
) -> tuple[FrameSizer, float, float]:
    """A backpressured channel: the sender always has a ``batch``-record frame waiting, cut as
    the sizer says; the receiver takes ``per_frame + per_record * records`` seconds a frame.
    Returns the sizer, the receiver's pace over the last 10 s and the work one frame holds."""
    sizer = FrameSizer()
    now, consumed_late, pending = 0.0, 0, 0
    frame = batch
    while now < seconds:
        if pending <= 0:  # the sender cuts its next batch
            pending = batch
        size = sizer.cut(pending, now) or pending
        frame = min(size, pending)
        pending -= frame
        now += per_frame + per_record * frame
        sizer.consumed(now, frame)
        if now > seconds - 10:
            consumed_late += frame
    return sizer, consumed_late / 10, per_frame + per_record * frame


def test_a_per_record_receiver_gets_frames_of_a_fraction_of_a_second():
    sizer, _, work = simulate(per_frame=0.0001, per_record=0.000005, batch=65536)
    assert sizer.most is not None
    assert work < 0.06  # (from 0.33 s a frame uncut)


def test_a_per_frame_receiver_keeps_its_frames_and_its_pace():
    uncut = 65536 / (0.05 + 0.0000001 * 65536)
    _, pace, _ = simulate(per_frame=0.05, per_record=0.0000001, batch=65536)
    assert pace > 0.8 * uncut


@settings(max_examples=60, deadline=None)
@given(
    per_frame=st.floats(0.00001, 0.05),
    per_record=st.floats(0.0000001, 0.00005),
    batch=st.integers(1_000, 100_000),
)
# halvings that each cost a little pace once added up to 40% (measured against the last size)
@example(per_frame=0.011414925801670533, per_record=2.5613051427657086e-05, batch=7702)
def test_cutting_never_costs_much_pace_and_never_makes_frames_longer(per_frame, per_record, batch):
    uncut_pace = batch / (per_frame + per_record * batch)
    sizer, pace, work = simulate(per_frame, per_record, batch)
    assert pace > 0.7 * uncut_pace
    assert work <= per_frame + per_record * batch + 1e-9
    if sizer.most is not None:
        assert sizer.most >= sizer.smallest
