"""The input of ``bench/joins.py``: five streams as Parquet files, made once and cached.

**Nexmark** (persons, auctions, bids), by the generator of ``bench/nexmark_reference.py``
extended to the two streams it leaves out: of every 50 events, event ``i`` is a person when
``i % 50 == 0``, an auction when ``i % 50`` is 1 to 3, else a bid; it happens at
``base + i * 1000 // rate`` ms and reaches the stream ``d`` ms later, ``d`` uniform in
``[0, max_delay)``. The bids are exactly those of ``bench/nexmark.py`` for the same
parameters (:func:`nexmark_reference._bid_columns`). Persons and auctions follow the Nexmark
generator (``PersonGenerator``, ``AuctionGenerator`` of the Nexmark suite):

* a person's ``id`` is ``1000 + i // 50``; ``name`` a first and a last name of its lists,
  ``city`` one of its 10 cities, ``state`` one of ``AZ, CA, ID, OR, WA, WY`` (uniform);
  ``email_address``, ``credit_card`` and ``extra`` random text;
* an auction's ``id`` is ``1000 + 3 * (i // 50) + (i % 50 - 1)``; its ``seller`` is, with
  probability 3/4 (``hotSellersRatio`` 4), the first person of the newest batch of 100
  (``(newest // 100) * 100``), else a random one of the 1,000 newest plus 10 not created
  yet; ``category`` is ``10 + `` uniform in ``[0, 5)``; ``initial_bid`` a Nexmark price and
  ``reserve`` that plus another; ``expires`` is ``date_time + 1 + `` uniform in
  ``[0, 2 * horizon)``, ``horizon`` the event time of the 1,666 events (100 auctions) after
  it (166-167 ms at 10,000 events/s: every auction lasts at most :data:`MAX_AUCTION_MS`).

**Orders and rates** (the as-of join's input), a stream of its own of as many events, in the
same model: event ``i`` is a rate when ``i % 10 == 0`` (``currency``, one of 20 codes,
uniform; ``rate`` in millionths, an int), else an order (``order_id = i``, a ``currency``,
``amount`` in cents). As 10 events share each millisecond, the rates are one per
millisecond: no two rates of one currency have the same time, so "the latest rate at or
before" an order is always one rate.

**Files**: each stream's rows in arrival order, in ``files`` slices of the same arrival
times (slice ``k`` of every stream holds the events that arrived between the same two
instants: a system reading one file of each stream at a time reads the streams side by
side), ``<stream>/<stream>-NNNNN.parquet`` with modification times in name order (Spark's
file source takes the oldest first), and ``csv/<stream>.csv`` with the columns the queries
read, one file per stream (PyFlink's wheel has no Parquet format, and its file source reads
a directory's files in no set order). Cached under the work directory by every parameter.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from nexmark_reference import (  # (bench/nexmark_reference.py, beside this file)
    ACTIVE_PEOPLE,
    AUCTIONS,
    BASE_TIME_MS,
    BID_SCHEMA,
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    HOT_BATCH,
    ID_LEAD,
    IN_FLIGHT_AUCTIONS,
    PERSONS,
    PROPORTION,
    InputSpec,
    _bid_columns,
    _channel_tables,
    _extra,
)

GENERATOR_VERSION = 1
"""Changes whenever this module makes different data from the same parameters."""

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah")
FIRST_NAMES += ("Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones")
LAST_NAMES += ("Noris",)
HOT_SELLERS_RATIO = 4  # P(hot seller) = 1 - 1/4
FIRST_CATEGORY, CATEGORIES = 10, 5
AUCTION_HORIZON_EVENTS = IN_FLIGHT_AUCTIONS * PROPORTION // AUCTIONS  # 1,666
MAX_AUCTION_MS = 1_000
"""No auction lasts longer (checked when the input is made): the interval join's bound."""
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CNY", "AUD", "CAD", "CHF", "HKD", "SGD")
CURRENCIES += ("SEK", "KRW", "NOK", "NZD", "INR", "MXN", "TWD", "ZAR", "BRL", "DKK")
RATE_EVERY = 10
"""Of the as-of stream's events, one in 10 is a rate, the others orders."""

STREAMS = ("persons", "auctions", "bids", "orders", "rates")
SCHEMAS = {
    "persons": pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("email_address", pa.string()),
            ("credit_card", pa.string()),
            ("city", pa.string()),
            ("state", pa.string()),
            ("date_time", pa.int64()),
            ("extra", pa.string()),
        ]
    ),
    "auctions": pa.schema(
        [
            ("id", pa.int64()),
            ("item_name", pa.string()),
            ("description", pa.string()),
            ("initial_bid", pa.int64()),
            ("reserve", pa.int64()),
            ("date_time", pa.int64()),
            ("expires", pa.int64()),
            ("seller", pa.int64()),
            ("category", pa.int64()),
            ("extra", pa.string()),
        ]
    ),
    "bids": BID_SCHEMA,
    "orders": pa.schema(
        [
            ("order_id", pa.int64()),
            ("currency", pa.string()),
            ("amount", pa.int64()),
            ("date_time", pa.int64()),
        ]
    ),
    "rates": pa.schema(
        [("currency", pa.string()), ("rate", pa.int64()), ("date_time", pa.int64())]
    ),
}
CSV_COLUMNS = {
    "persons": ("id", "name", "city", "state", "date_time"),
    "auctions": ("id", "seller", "category", "date_time", "expires"),
    "bids": ("auction", "bidder", "price", "date_time"),
    "orders": ("order_id", "currency", "amount", "date_time"),
    "rates": ("currency", "rate", "date_time"),
}
"""The columns each stream's CSV copy holds (for PyFlink): those the queries read."""


@dataclass(frozen=True)
class JoinsSpec:
    events: int
    """Nexmark events (persons, auctions, bids), and as many orders and rates."""
    files: int
    """Slices of each stream (files per stream)."""
    seed: int = 37
    rate: int = 10_000
    """Events per second of event time (in each of the two event sequences)."""
    max_delay_ms: int = 2_000
    """Each event arrives ``[0, max_delay_ms)`` ms late."""
    base_time_ms: int = BASE_TIME_MS

    def key(self) -> str:
        text = json.dumps({**asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        return f"joins-{self.events}-{self.files}-{digest}"

    def nexmark(self) -> InputSpec:
        """The bids' generator parameters (``rows_per_file`` is not used here)."""
        return InputSpec(
            events=self.events,
            rows_per_file=self.events,
            seed=self.seed,
            rate=self.rate,
            max_delay_ms=self.max_delay_ms,
            base_time_ms=self.base_time_ms,
        )


@dataclass(frozen=True)
class JoinsInput:
    spec: JoinsSpec
    directory: Path
    rows: dict[str, int]
    """Rows of each stream."""
    seconds_to_generate: float | None

    def parquet(self, stream: str) -> Path:
        return self.directory / stream

    def csv(self, stream: str) -> Path:
        return self.directory / "csv" / f"{stream}.csv"

    def read(self, stream: str, columns: Iterable[str] | None = None) -> pa.Table:
        """Every row of ``stream`` (in file order), the columns asked for."""
        names = list(columns) if columns is not None else None
        files = sorted(self.parquet(stream).glob("*.parquet"))
        return pa.concat_tables(pq.read_table(f, columns=names) for f in files)


# ----------------------------------------------------------------------------- generator


def _letters(rng: np.random.Generator, n: int, length: int, alphabet: bytes) -> pa.Array:
    """``n`` random strings of ``length`` characters of ``alphabet``, built from buffers."""
    chars = np.frombuffer(alphabet, dtype=np.uint8)
    data = chars[rng.integers(0, len(chars), n * length)]
    offsets = np.arange(n + 1, dtype=np.int32) * length
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


LOWER = b"abcdefghijklmnopqrstuvwxyz"


def _pick(rng: np.random.Generator, n: int, values: tuple[str, ...]) -> pa.Array:
    return pc.take(pa.array(values), pa.array(rng.integers(0, len(values), n)))


def _times(spec: JoinsSpec, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Event times and arrival times of events ``ids``."""
    event_time = spec.base_time_ms + (ids * 1000) // spec.rate
    return event_time, event_time + rng.integers(0, spec.max_delay_ms, len(ids))


def _price(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.rint(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


def _persons(spec: JoinsSpec) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 3])
    ids = np.arange(0, spec.events, PROPORTION, dtype=np.int64)  # i % 50 == 0
    n = len(ids)
    event_time, arrival = _times(spec, ids, rng)
    first, last = _pick(rng, n, FIRST_NAMES), _pick(rng, n, LAST_NAMES)
    email = pc.binary_join_element_wise(_letters(rng, n, 7, LOWER), _letters(rng, n, 5, LOWER), "@")
    card = pc.binary_join_element_wise(*(_letters(rng, n, 4, b"0123456789") for _ in range(4)), " ")
    table = pa.table(
        {
            "id": ids // PROPORTION + FIRST_PERSON_ID,
            "name": pc.binary_join_element_wise(first, last, " "),
            "email_address": pc.binary_join_element_wise(email, pa.scalar("com"), "."),
            "credit_card": card,
            "city": _pick(rng, n, US_CITIES),
            "state": _pick(rng, n, US_STATES),
            "date_time": event_time,
            "extra": _extra(rng, n),
        },
        schema=SCHEMAS["persons"],
    )
    return table, arrival


def _auctions(spec: JoinsSpec) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 4])
    ids = np.arange(spec.events, dtype=np.int64)
    ids = ids[(ids % PROPORTION >= PERSONS) & (ids % PROPORTION < PERSONS + AUCTIONS)]
    n = len(ids)
    event_time, arrival = _times(spec, ids, rng)
    epoch = ids // PROPORTION
    newest_person = epoch * PERSONS + (PERSONS - 1)  # 0-based, the person of its group
    hot = rng.integers(0, HOT_SELLERS_RATIO, n) > 0
    people = newest_person + 1
    active = np.minimum(people, ACTIVE_PEOPLE)
    random_seller = people - active + rng.integers(0, active + ID_LEAD)
    seller = np.where(hot, (newest_person // HOT_BATCH) * HOT_BATCH, random_seller)
    later = spec.base_time_ms + ((ids + AUCTION_HORIZON_EVENTS) * 1000) // spec.rate
    horizon = np.maximum((later - event_time) * 2, 1)
    expires = event_time + 1 + (rng.random(n) * horizon).astype(np.int64)
    if n and int((expires - event_time).max()) > MAX_AUCTION_MS:
        raise ValueError(f"an auction lasts over {MAX_AUCTION_MS} ms: raise MAX_AUCTION_MS")
    initial = _price(rng, n)
    table = pa.table(
        {
            "id": epoch * AUCTIONS + (ids % PROPORTION - PERSONS) + FIRST_AUCTION_ID,
            "item_name": _letters(rng, n, 20, LOWER),
            "description": _letters(rng, n, 100, LOWER),
            "initial_bid": initial,
            "reserve": initial + _price(rng, n),
            "date_time": event_time,
            "expires": expires,
            "seller": seller + FIRST_PERSON_ID,
            "category": FIRST_CATEGORY + rng.integers(0, CATEGORIES, n),
            "extra": _extra(rng, n),
        },
        schema=SCHEMAS["auctions"],
    )
    return table, arrival


def _bids(spec: JoinsSpec) -> tuple[pa.Table, np.ndarray]:
    columns = _bid_columns(spec.nexmark())
    names, urls = _channel_tables(spec.seed)
    channel = pa.array(columns["channel_index"])
    rng = np.random.default_rng([spec.seed, 5])
    table = pa.table(
        {
            "auction": columns["auction"],
            "bidder": columns["bidder"],
            "price": columns["price"],
            "channel": pc.take(names, channel),
            "url": pc.take(urls, channel),
            "date_time": columns["date_time"],
            "extra": _extra(rng, len(channel)),
        },
        schema=BID_SCHEMA,
    )
    return table, columns["arrival"]


def _orders_and_rates(spec: JoinsSpec) -> dict[str, tuple[pa.Table, np.ndarray]]:
    rng = np.random.default_rng([spec.seed, 6])
    ids = np.arange(spec.events, dtype=np.int64)
    is_rate = ids % RATE_EVERY == 0
    made = {}
    for stream, chosen in (("rates", is_rate), ("orders", ~is_rate)):
        own = ids[chosen]
        n = len(own)
        event_time, arrival = _times(spec, own, rng)
        currency = _pick(rng, n, CURRENCIES)
        if stream == "rates":
            columns = {"currency": currency, "rate": rng.integers(500_000, 2_000_000, n)}
        else:
            amount = rng.integers(100, 1_000_000, n)
            columns = {"order_id": own, "currency": currency, "amount": amount}
        table = pa.table({**columns, "date_time": event_time}, schema=SCHEMAS[stream])
        made[stream] = (table, arrival)
    return made


def _in_arrival_order(table: pa.Table, arrival: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    order = np.lexsort((np.arange(len(arrival)), arrival))  # stable: by arrival, then made
    return table.take(pa.array(order)), arrival[order]


def _slices(arrivals: list[np.ndarray], files: int) -> np.ndarray:
    """The arrival instants between the slices: every ``1/files`` of the events of the
    streams together."""
    every = np.sort(np.concatenate(arrivals))
    cuts = [len(every) * k // files for k in range(1, files)]
    return every[cuts] if len(every) else np.zeros(0, dtype=np.int64)


def prepare_joins_input(
    spec: JoinsSpec, work: Path, log: Callable[[str], None] = print
) -> JoinsInput:
    """The input of ``spec`` under ``work``: made once (into a temporary folder renamed when
    complete), then found there by its key."""
    directory = work / spec.key()
    manifest = directory / "manifest.json"
    if not manifest.exists():
        started = time.perf_counter()
        partial = work / f".{spec.key()}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        rows = _write(spec, partial)
        seconds = time.perf_counter() - started
        info = {"spec": asdict(spec), "version": GENERATOR_VERSION, "rows": rows}
        info["seconds_to_generate"] = seconds
        (partial / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
        log(f"generated {spec.events:,} + {spec.events:,} events in {seconds:.1f} s: {directory}")
    info = json.loads(manifest.read_text())
    return JoinsInput(spec, directory, info["rows"], info.get("seconds_to_generate"))


def _write(spec: JoinsSpec, directory: Path) -> dict[str, int]:
    groups = [
        {"persons": _persons(spec), "auctions": _auctions(spec), "bids": _bids(spec)},
        _orders_and_rates(spec),
    ]
    (directory / "csv").mkdir(parents=True)
    rows = {}
    for group in groups:
        ordered = {s: _in_arrival_order(*made) for s, made in group.items()}
        cuts = _slices([arrival for _, arrival in ordered.values()], spec.files)
        for stream, (table, arrival) in ordered.items():
            rows[stream] = table.num_rows
            _write_stream(directory, stream, table, np.searchsorted(arrival, cuts, side="left"))
    return rows


def _write_stream(directory: Path, stream: str, table: pa.Table, cuts: np.ndarray) -> None:
    (directory / stream).mkdir()
    mtime = 1_600_000_000  # in name order: Spark's file source takes new files oldest first
    bounds = [0, *cuts.tolist(), table.num_rows]
    for k in range(len(bounds) - 1):
        path = directory / stream / f"{stream}-{k:05d}.parquet"
        pq.write_table(table.slice(bounds[k], bounds[k + 1] - bounds[k]), path)
        os.utime(path, (mtime + k, mtime + k))
    csv = table.select(list(CSV_COLUMNS[stream]))
    pacsv.write_csv(
        csv,
        directory / "csv" / f"{stream}.csv",
        write_options=pacsv.WriteOptions(include_header=False),
    )
