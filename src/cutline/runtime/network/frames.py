"""How large a records frame may be when it has to wait for credit: a simple form of Flink's
*buffer debloating*.

Under backpressure every channel holds as many frames as its credit allows, and an aligned
barrier waits behind all of them: with large batches (a source reads up to ``batch_size``
records at once) that is seconds of the slow receiver's work, and checkpoints come late. So
an output channel cuts a frame that would wait into frames of about :attr:`FrameSizer.seconds`
of the receiver's work, measured from the records whose credit came back (the receiver
consumed them). Cutting is only worth it when the receiver's cost grows with the records of a
frame; where it is per frame (a ``map_batches`` that calls a service once per batch), smaller
frames would slow it down, and the job with it. So each smaller size is a trial: if the
receiver's pace drops below :attr:`FrameSizer.tolerance` of what it was before the frames were
first cut, the size goes back and stays for a while (measured against the uncut pace, not the
last size's: trials that each cost a little would otherwise add up).

Pure bookkeeping, no clock of its own: the channel says when frames were consumed and asks for
the size at a given moment.
"""

from __future__ import annotations

from collections import deque


class FrameSizer:
    """The most records a waiting frame may hold (``None``: no limit), for one channel.

    :param seconds: the receiver's work a frame should hold.
    :param smallest: never fewer records per frame (a frame has its own cost).
    :param window: seconds over which the receiver's pace is measured; the size changes at
        most once per window.
    :param tolerance: a smaller size is kept only if the pace stays above this share of the
        pace before it.
    :param patience: windows a size that cost pace is kept before trying again.
    """

    def __init__(
        self,
        *,
        seconds: float = 0.025,
        smallest: int = 256,
        window: float = 1.0,
        tolerance: float = 0.85,
        patience: int = 10,
    ) -> None:
        self.seconds, self.smallest, self.window = seconds, smallest, window
        self.tolerance, self.patience = tolerance, patience
        self.most: int | None = None
        self._consumed: deque[tuple[float, int]] = deque()
        self._decided_at: float | None = None
        self._trial: tuple[int | None, float] | None = None
        """The size before the last cut, and the pace then (until the next window says)."""
        self._uncut_pace = 0.0
        """The pace when the frames were last uncut: no cut may cost much of it."""
        self._held_until = 0.0

    def consumed(self, now: float, records: int) -> None:
        """The receiver consumed a frame of ``records`` records (its credit came back)."""
        self._consumed.append((now, records))
        while self._consumed and now - self._consumed[0][0] > self.window:
            self._consumed.popleft()

    def pace(self) -> float | None:
        """Records per second the receiver consumed in the last window (``None``: too few
        frames to say)."""
        consumed = self._consumed
        if len(consumed) < 4:
            return None
        span = consumed[-1][0] - consumed[0][0]
        if span <= 0:
            return None
        return sum(n for _, n in list(consumed)[1:]) / span

    def decide(self, now: float) -> int | None:
        """The size to cut a waiting frame to, now (changes at most once per window)."""
        if self._decided_at is not None and now - self._decided_at < self.window:
            return self.most
        pace = self.pace()
        if pace is None:
            return self.most
        self._decided_at = now
        if self.most is None:
            self._uncut_pace = pace
        if self._trial is not None:  # was the last cut worth it?
            before, pace_before = self._trial
            self._trial = None
            if pace < self.tolerance * max(pace_before, self._uncut_pace):  # cost is per frame
                self.most = before
                self._held_until = now + self.patience * self.window
                return self.most
        ideal = max(self.smallest, int(pace * self.seconds))
        frames = [n for _, n in self._consumed]
        typical = sum(frames) / len(frames)
        if self.most is not None and ideal >= 2 * self.most:
            self.most = None if ideal >= typical * 2 else ideal  # the receiver sped up
        elif ideal * 3 < 2 * (self.most or typical) and now >= self._held_until:
            smaller = max(ideal, int((self.most or typical) // 2))
            self._trial = (self.most, pace)
            self.most = smaller
        return self.most

    def cut(self, count: int, now: float) -> int | None:
        """The records per frame to cut a waiting frame of ``count`` records into (``None``:
        do not cut it)."""
        most = self.decide(now)
        if most is None or count <= most + most // 2:
            return None
        pieces = -(-count // most)
        return -(-count // pieces)
