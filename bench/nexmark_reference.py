"""The Nexmark input of ``bench/nexmark.py`` and the ground truth of its queries.

Two parts, both plain Python with numpy and pyarrow (no Spark, no cutline):

* :func:`prepare_input`: a Nexmark event stream (persons, auctions, bids), deterministic from
  a seed, of which the bids are written to Parquet once, in files of a fixed number of rows,
  in arrival order (file ``k`` holds the ``k``-th slice of the stream), and cached under a
  work directory keyed by every parameter;
* :func:`reference_answers` (numpy, vectorized) and :func:`python_answers` (per record, with
  dicts: the cross-check of the first): the answers of q5, q7 and q11 computed in one
  process from the Parquet files themselves.

The generator follows the Nexmark generator (the Beam and Flink Nexmark suites): of every
50 events, 1 is a person, 3 are auctions and 46 are bids; event ``i``'s id decides which, and
the ids of the newest person and auction it may refer to. A bid goes to the newest "hot"
auction (the first of the newest batch of 100 auctions) with probability 1/2 (the default
``hotAuctionRatio`` of 2), else to a random auction among the 100 newest, plus 10 not
created yet; it comes from the hot bidder (the second person of the newest batch of 100)
with probability 3/4 (``hotBiddersRatio`` 4), else from a random one of the 1,000 newest
people, plus 10 not created yet. Ids start at 1000. A price is ``round(10 ** (6 u) * 100)``;
the channel is one of the 4 hot channels with probability 1/2, else ``channel-N`` of 10,000;
``extra`` is a random string padding the bid to about 100 bytes (54 to 81 characters).

Event time: event ``i`` happens at ``base + i * 1000 // rate`` ms (default rate 10,000
events/s of event time: 10,000,000 events span 1,000 s). Out-of-orderness: every event
reaches the stream ``d`` ms late, ``d`` uniform in ``[0, max_delay)`` (default 2,000 ms),
and the stream is in order of arrival (``time + d``, then id). So an event is never more than
``max_delay - 1`` ms older than the newest one before it: with a watermark bound of 2 s, no
record is late.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

GENERATOR_VERSION = 2
"""Changes whenever the generator makes different data from the same parameters."""

# The Nexmark generator's constants.
PROPORTION = 50
PERSONS, AUCTIONS = 1, 3  # of every 50 events; the other 46 are bids
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
HOT_BATCH = 100  # hot auctions and bidders: the first (second) of the newest batch of 100
HOT_AUCTION_RATIO = 2  # P(hot auction) = 1 - 1/2
HOT_BIDDERS_RATIO = 4  # P(hot bidder) = 1 - 1/4
IN_FLIGHT_AUCTIONS = 100
ACTIVE_PEOPLE = 1000
ID_LEAD = 10  # ids not created yet that a bid may name
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000
EXTRA_LENGTH = (54, 82)  # [min, max): pads a 32-byte bid to about 100 bytes

BASE_TIME_MS = 1_700_000_003_250
"""The first event's time (2023-11-14T22:13:23.250Z): not on a window boundary."""

# The queries' windows (milliseconds).
Q5_SIZE, Q5_SLIDE = 10_000, 2_000
Q7_SIZE = 10_000
Q11_GAP = 10_000

BID_SCHEMA = pa.schema(
    [
        ("auction", pa.int64()),
        ("bidder", pa.int64()),
        ("price", pa.int64()),
        ("channel", pa.string()),
        ("url", pa.string()),
        ("date_time", pa.int64()),
        ("extra", pa.string()),
    ]
)
CSV_COLUMNS = ("auction", "bidder", "price", "date_time")
"""The columns of the CSV copy (for PyFlink, whose wheel has no Parquet format): those the
queries read."""

Answers = dict[str, set[tuple[int, ...]]]


@dataclass(frozen=True)
class InputSpec:
    events: int
    """Nexmark events generated (persons, auctions and bids); 92% of them are bids."""
    rows_per_file: int
    """Bids per Parquet file (the last one may hold fewer)."""
    seed: int = 18
    rate: int = 10_000
    """Events per second of event time."""
    max_delay_ms: int = 2_000
    """Each event arrives ``[0, max_delay_ms)`` ms late."""
    base_time_ms: int = BASE_TIME_MS

    def key(self) -> str:
        text = json.dumps({**asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        return f"bids-{self.events}-{self.rows_per_file}-{digest}"


@dataclass(frozen=True)
class Input:
    spec: InputSpec
    directory: Path
    parquet: Path
    """The bids, ``bids-00000.parquet`` ...: what every system reads."""
    csv: Path
    """The same bids in the same files, as CSV with the columns the queries read."""
    spark: Path
    """Hard links to the Parquet files, and two one-row files after them (see ``prepare``)."""
    bids: int
    files: int
    min_time_ms: int
    max_time_ms: int
    sentinel_time_ms: int
    seconds_to_generate: float | None


# ----------------------------------------------------------------------------- generator


def _bid_columns(spec: InputSpec) -> dict[str, np.ndarray]:
    """The bids' numeric columns, in arrival order, plus ``channel_index`` (into
    :func:`_channel_tables`) and ``arrival`` (when each bid reaches the stream, ms: what
    ``bench/joins.py`` slices its streams by; not written here)."""
    rng = np.random.default_rng(spec.seed)
    ids = np.arange(spec.events, dtype=np.int64)
    ids = ids[ids % PROPORTION >= PERSONS + AUCTIONS]  # the bids' event ids
    n = len(ids)
    epoch = ids // PROPORTION
    # the newest auction and person an event may refer to (0-based): for a bid, the last
    # auction and the person of its own group of 50
    last_auction = epoch * AUCTIONS + (AUCTIONS - 1)
    last_person = epoch * PERSONS + (PERSONS - 1)

    hot_auction = rng.integers(0, HOT_AUCTION_RATIO, n) > 0
    low = np.maximum(last_auction - IN_FLIGHT_AUCTIONS, 0)
    random_auction = low + rng.integers(0, last_auction - low + 1 + ID_LEAD)
    auction = np.where(hot_auction, (last_auction // HOT_BATCH) * HOT_BATCH, random_auction)

    hot_bidder = rng.integers(0, HOT_BIDDERS_RATIO, n) > 0
    people = last_person + 1
    active = np.minimum(people, ACTIVE_PEOPLE)
    random_bidder = people - active + rng.integers(0, active + ID_LEAD)
    bidder = np.where(hot_bidder, (last_person // HOT_BATCH) * HOT_BATCH + 1, random_bidder)

    price = np.rint(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)
    hot_channel = rng.integers(0, 2, n) > 0
    channel = np.where(
        hot_channel,
        rng.integers(0, len(HOT_CHANNELS), n),
        len(HOT_CHANNELS) + rng.integers(0, CHANNELS, n),
    )
    event_time = spec.base_time_ms + (ids * 1000) // spec.rate
    arrival = event_time + rng.integers(0, spec.max_delay_ms, n)
    order = np.lexsort((ids, arrival))  # by arrival, then id
    return {
        "auction": (auction + FIRST_AUCTION_ID)[order],
        "bidder": (bidder + FIRST_PERSON_ID)[order],
        "price": price[order],
        "date_time": event_time[order],
        "channel_index": channel[order],
        "arrival": arrival[order],
    }


def _channel_tables(seed: int) -> tuple[pa.Array, pa.Array]:
    """Every channel's name and URL: the 4 hot ones, then ``channel-0`` ... ``channel-9999``."""
    rng = np.random.default_rng([seed, 1])
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)

    def word() -> str:
        return letters[rng.integers(0, 26, 5)].tobytes().decode()

    names = [*HOT_CHANNELS, *(f"channel-{k}" for k in range(CHANNELS))]
    urls = [f"https://www.nexmark.com/{word()}/{word()}/{word()}/item.htm?query=1" for _ in names]
    urls = [u if k < len(HOT_CHANNELS) else f"{u}&channel_id={k}" for k, u in enumerate(urls)]
    return pa.array(names, pa.string()), pa.array(urls, pa.string())


def _extra(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` random lowercase strings of 54 to 81 characters, built from buffers."""
    lengths = rng.integers(EXTRA_LENGTH[0], EXTRA_LENGTH[1], n).astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def prepare_input(spec: InputSpec, work: Path, log: Callable[[str], None] = print) -> Input:
    """The input of ``spec`` under ``work``: made once (into a temporary folder renamed when
    complete), then found there by its key."""
    directory = work / spec.key()
    manifest = directory / "manifest.json"
    if not manifest.exists():
        started = time.perf_counter()
        partial = work / f".{spec.key()}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        _write(spec, partial)
        seconds = time.perf_counter() - started
        info = json.loads((partial / "manifest.json").read_text())
        info["seconds_to_generate"] = seconds
        (partial / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
        log(
            f"generated {spec.events:,} events ({info['bids']:,} bids) in {seconds:.1f} s: {directory}"
        )
    info = json.loads(manifest.read_text())
    return Input(
        spec=spec,
        directory=directory,
        parquet=directory / "parquet",
        csv=directory / "csv",
        spark=directory / "spark",
        bids=info["bids"],
        files=info["files"],
        min_time_ms=info["min_time_ms"],
        max_time_ms=info["max_time_ms"],
        sentinel_time_ms=info["sentinel_time_ms"],
        seconds_to_generate=info.get("seconds_to_generate"),
    )


def _write(spec: InputSpec, directory: Path) -> None:
    columns = _bid_columns(spec)
    names, urls = _channel_tables(spec.seed)
    n = len(columns["date_time"])
    for sub in ("parquet", "csv", "spark"):
        (directory / sub).mkdir(parents=True)
    # modification times in name order: Spark's file source takes new files oldest first
    mtime = 1_600_000_000
    starts = range(0, n, spec.rows_per_file)
    csv_schema = pa.schema([BID_SCHEMA.field(c) for c in CSV_COLUMNS])
    csv = pacsv.CSVWriter(
        directory / "csv" / "bids.csv",
        csv_schema,
        write_options=pacsv.WriteOptions(include_header=False),
    )
    for files, start in enumerate(starts):
        stop = min(n, start + spec.rows_per_file)
        rng = np.random.default_rng([spec.seed, 2, files])
        channel = pa.array(columns["channel_index"][start:stop])
        table = pa.table(
            {
                "auction": columns["auction"][start:stop],
                "bidder": columns["bidder"][start:stop],
                "price": columns["price"][start:stop],
                "channel": pc.take(names, channel),
                "url": pc.take(urls, channel),
                "date_time": columns["date_time"][start:stop],
                "extra": _extra(rng, stop - start),
            },
            schema=BID_SCHEMA,
        )
        name = f"bids-{files:05d}"
        path = directory / "parquet" / f"{name}.parquet"
        pq.write_table(table, path)
        os.utime(path, (mtime + files, mtime + files))
        os.link(path, directory / "spark" / f"{name}.parquet")
        csv.write_table(table.select(list(CSV_COLUMNS)))
    csv.close()
    files = len(starts)
    max_time = int(columns["date_time"].max())
    # Spark's watermark stops at (newest event - 2 s) when the input ends, so the last
    # windows would never close: two one-row files far in event time after the input move
    # it past every window (the second file's micro-batch runs with the watermark the first
    # one set). Their own windows never close, so they appear in no answer.
    sentinel = max_time + 3_600_000
    for k in (1, 2):
        row = pa.table(
            {
                "auction": [-1],
                "bidder": [-1],
                "price": [0],
                "channel": [""],
                "url": [""],
                "date_time": [sentinel],
                "extra": [""],
            },
            schema=BID_SCHEMA,
        )
        path = directory / "spark" / f"bids-zz-end-{k}.parquet"
        pq.write_table(row, path)
        os.utime(path, (mtime + files + k, mtime + files + k))
    info = {
        "spec": asdict(spec),
        "generator_version": GENERATOR_VERSION,
        "bids": n,
        "files": files,
        "min_time_ms": int(columns["date_time"].min()),
        "max_time_ms": max_time,
        "sentinel_time_ms": sentinel,
    }
    (directory / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")


def read_bids(
    parquet: Path, columns: Iterable[str] = ("auction", "bidder", "price", "date_time")
) -> dict[str, np.ndarray]:
    """The columns of every bid file, in file order, as numpy arrays."""
    table = pa.concat_tables(
        pq.read_table(path, columns=list(columns)) for path in sorted(parquet.glob("*.parquet"))
    )
    return {name: table.column(name).to_numpy() for name in columns}


def out_of_order_stats(bids: dict[str, np.ndarray]) -> dict[str, int]:
    """How far behind the newest event before it each event comes (ms), in file order."""
    times = bids["date_time"]
    behind = np.maximum.accumulate(times) - times
    return {
        "max_behind_ms": int(behind.max()),
        "events_behind": int((behind > 0).sum()),
    }


# ----------------------------------------------------------------------------- reference


def reference_answers(
    bids: dict[str, np.ndarray], queries: Iterable[str], *, merge_touching: bool = True
) -> Answers:
    """The queries' answers, vectorized. ``merge_touching``: in q11, an event exactly ``gap``
    after the previous one continues its session (Flink's and Spark's session windows, whose
    ``[t, t + gap)`` intervals merge when they touch) instead of starting a new one."""
    answers: Answers = {}
    for query in queries:
        if query == "q5":
            answers[query] = _q5(bids["auction"], bids["date_time"])
        elif query == "q7":
            answers[query] = _q7(bids["price"], bids["date_time"])
        elif query == "q11":
            answers[query] = _q11(bids["bidder"], bids["date_time"], merge_touching)
        else:
            raise ValueError(f"unknown query {query!r}")
    return answers


def _q5(auction: np.ndarray, times: np.ndarray) -> set[tuple[int, ...]]:
    """Per sliding window (10 s every 2 s), the auctions with the most bids:
    ``(window_start, window_end, auction, count)``."""
    per = Q5_SIZE // Q5_SLIDE
    last_start = (times - times % Q5_SLIDE) // Q5_SLIDE  # in slides
    starts = (last_start[:, None] - np.arange(per)[None, :]).ravel()
    low = int(auction.min())
    span = int(auction.max()) - low + 1
    keys = starts * span + np.repeat(auction - low, per)
    unique, counts = np.unique(keys, return_counts=True)
    window = unique // span
    first = np.flatnonzero(np.r_[True, window[1:] != window[:-1]])
    best = np.maximum.reduceat(counts, first)
    sizes = np.diff(np.r_[first, len(window)])
    hot = counts == np.repeat(best, sizes)
    start_ms = window[hot] * Q5_SLIDE
    return set(
        zip(
            start_ms.tolist(),
            (start_ms + Q5_SIZE).tolist(),
            (unique[hot] % span + low).tolist(),
            counts[hot].tolist(),
            strict=True,
        )
    )


def _q7(price: np.ndarray, times: np.ndarray) -> set[tuple[int, ...]]:
    """Per tumbling window of 10 s, the highest price: ``(window_start, window_end, price)``."""
    start = times - times % Q7_SIZE
    order = np.argsort(start, kind="stable")
    start, price = start[order], price[order]
    first = np.flatnonzero(np.r_[True, start[1:] != start[:-1]])
    best = np.maximum.reduceat(price, first)
    return set(
        zip(start[first].tolist(), (start[first] + Q7_SIZE).tolist(), best.tolist(), strict=True)
    )


def _q11(bidder: np.ndarray, times: np.ndarray, merge_touching: bool) -> set[tuple[int, ...]]:
    """Per bidder, session windows of gap 10 s: ``(bidder, window_start, window_end, count)``
    with ``window_end`` = the last event's time + the gap."""
    order = np.lexsort((times, bidder))
    bidder, times = bidder[order], times[order]
    gap = np.diff(times)
    apart = gap > Q11_GAP if merge_touching else gap >= Q11_GAP
    new = np.r_[True, (bidder[1:] != bidder[:-1]) | apart]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(times)] - 1
    return set(
        zip(
            bidder[first].tolist(),
            times[first].tolist(),
            (times[last] + Q11_GAP).tolist(),
            (last - first + 1).tolist(),
            strict=True,
        )
    )


def exact_gap_pairs(bids: dict[str, np.ndarray]) -> int:
    """Consecutive events of one bidder exactly ``Q11_GAP`` apart: where session windows that
    merge when they touch and those that do not give different q11 answers."""
    order = np.lexsort((bids["date_time"], bids["bidder"]))
    bidder, times = bids["bidder"][order], bids["date_time"][order]
    same = bidder[1:] == bidder[:-1]
    return int((same & (np.diff(times) == Q11_GAP)).sum())


def python_answers(
    bids: dict[str, np.ndarray], queries: Iterable[str], *, merge_touching: bool = True
) -> Answers:
    """The same answers one record at a time with dicts: the cross-check of
    :func:`reference_answers` (written from the definitions, not from the vectorized code)."""
    auctions = bids["auction"].tolist()
    bidders = bids["bidder"].tolist()
    prices = bids["price"].tolist()
    times = bids["date_time"].tolist()
    answers: Answers = {}
    for query in queries:
        if query == "q5":
            counts: dict[int, Counter[int]] = defaultdict(Counter)
            for auction, t in zip(auctions, times, strict=True):
                start = t - t % Q5_SLIDE
                while start > t - Q5_SIZE:  # every window [start, start + size) holding t
                    counts[start][auction] += 1
                    start -= Q5_SLIDE
            hot: set[tuple[int, ...]] = set()
            for start, per_auction in counts.items():
                top = max(per_auction.values())
                hot.update(
                    (start, start + Q5_SIZE, a, c) for a, c in per_auction.items() if c == top
                )
            answers[query] = hot
        elif query == "q7":
            highest: dict[int, int] = {}
            for price, t in zip(prices, times, strict=True):
                start = t - t % Q7_SIZE
                if price > highest.get(start, -1):
                    highest[start] = price
            answers[query] = {(s, s + Q7_SIZE, p) for s, p in highest.items()}
        elif query == "q11":
            per_bidder: dict[int, list[int]] = defaultdict(list)
            for bidder, t in zip(bidders, times, strict=True):
                per_bidder[bidder].append(t)
            sessions: set[tuple[int, ...]] = set()
            for bidder, ts in per_bidder.items():
                ts.sort()
                first = previous = ts[0]
                count = 0
                for t in ts:
                    ended = t - previous > Q11_GAP if merge_touching else t - previous >= Q11_GAP
                    if ended:
                        sessions.add((bidder, first, previous + Q11_GAP, count))
                        first, count = t, 0
                    previous = t
                    count += 1
                sessions.add((bidder, first, previous + Q11_GAP, count))
            answers[query] = sessions
        else:
            raise ValueError(f"unknown query {query!r}")
    return answers
