"""The four joins of ``bench/joins.py``, defined exactly, and their ground truth.

Every answer is a multiset of rows (a row may come twice and must then come twice); the
columns of each query's answer are :data:`ANSWER_COLUMNS`. Times are epoch milliseconds.

* **q3** (Nexmark q3, a regular inner join): every pair of an auction ``A`` and a person
  ``P`` with ``A.seller = P.id``, ``A.category = 10`` and ``P.state`` in OR, ID, CA:
  ``(P.name, P.city, P.state, A.id)``. No time bounds the pairing: a system keeps both
  sides for ever.
* **q8** (Nexmark q8's join, a window join): every pair of a person ``P`` and an auction
  ``A`` with ``P.id = A.seller`` whose times fall in the same tumbling window of 10 s
  (windows ``[k * 10 s, (k + 1) * 10 s)`` from the epoch): ``(P.id, P.name, window_start,
  A.id)``. Nexmark's q8 groups each side by window before joining, one row per person and
  window; its rows are those of this answer without ``A.id``, made distinct.
* **q9** (q9-like, an interval join; Nexmark's q9 joins the same way, then keeps each
  auction's highest bid): every pair of an auction ``A`` and a bid ``B`` with
  ``B.auction = A.id`` and ``0 <= B.date_time - A.date_time <= 1000`` ms (inclusive: the
  interval join's bounds, which every auction's length is under, see
  :data:`joins_input.MAX_AUCTION_MS`) and ``B.date_time <= A.expires`` (a condition on the
  pair: the bid came while the auction was open): ``(A.id, B.bidder, B.price, B.date_time,
  A.expires)``.
* **asof** (an as-of join, left): every order ``O`` once, with the rate ``R`` of the same
  currency whose ``R.date_time`` is the greatest at or before ``O.date_time``, or nulls
  when its currency has no rate that early: ``(O.order_id, O.currency, O.amount,
  O.date_time, R.rate, R.date_time)``.

:func:`reference_answers` computes them with pyarrow's hash join and NumPy;
:func:`python_answers` one record at a time with dicts and ``bisect``, written from the
definitions above (the cross-check of the first). :func:`compare` checks an answer against
the expected one exactly, vectorized.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from joins_input import JoinsInput

QUERIES = ("q3", "q8", "q9", "asof")
Q3_CATEGORY = 10
Q3_STATES = ("OR", "ID", "CA")
Q8_WINDOW_MS = 10_000
Q9_BOUND_MS = 1_000
ANSWER_COLUMNS = {
    "q3": ("name", "city", "state", "auction_id"),
    "q8": ("person_id", "name", "window_start", "auction_id"),
    "q9": ("auction_id", "bidder", "price", "bid_time", "expires"),
    "asof": ("order_id", "currency", "amount", "order_time", "rate", "rate_time"),
}
STREAMS_READ = {
    "q3": ("persons", "auctions"),
    "q8": ("persons", "auctions"),
    "q9": ("auctions", "bids"),
    "asof": ("orders", "rates"),
}
COLUMNS_READ = {
    ("q3", "persons"): ("id", "name", "city", "state", "date_time"),
    ("q3", "auctions"): ("id", "seller", "category", "date_time"),
    ("q8", "persons"): ("id", "name", "date_time"),
    ("q8", "auctions"): ("id", "seller", "date_time"),
    ("q9", "auctions"): ("id", "date_time", "expires"),
    ("q9", "bids"): ("auction", "bidder", "price", "date_time"),
    ("asof", "orders"): ("order_id", "currency", "amount", "date_time"),
    ("asof", "rates"): ("currency", "rate", "date_time"),
}
"""The columns each query reads of each stream (every system reads these only)."""
NULL = np.iinfo(np.int64).min
"""What a null is in :func:`canonical` (no value of these columns is it)."""
ABSENT = -2
"""What a string the expected answer does not have is in :func:`canonical`."""


def read_inputs(inp: JoinsInput, query: str) -> dict[str, pa.Table]:
    return {s: inp.read(s, COLUMNS_READ[query, s]) for s in STREAMS_READ[query]}


# ----------------------------------------------------------------------------- vectorized


def reference_answers(inp: JoinsInput, queries: Iterable[str]) -> dict[str, pa.Table]:
    """Each query's answer as a table of :data:`ANSWER_COLUMNS` (rows in no set order)."""
    return {q: REFERENCE[q](read_inputs(inp, q)) for q in queries}


def _q3(tables: dict[str, pa.Table]) -> pa.Table:
    persons = tables["persons"].filter(pc.is_in(tables["persons"]["state"], pa.array(Q3_STATES)))
    auctions = tables["auctions"].filter(pc.equal(tables["auctions"]["category"], Q3_CATEGORY))
    left = auctions.select(["id", "seller"]).rename_columns(["auction_id", "seller"])
    joined = left.join(persons.select(["id", "name", "city", "state"]), "seller", "id", "inner")
    return joined.select(list(ANSWER_COLUMNS["q3"]))


def _window(times: pa.ChunkedArray) -> np.ndarray:
    t = times.to_numpy()
    return t - t % Q8_WINDOW_MS


def _q8(tables: dict[str, pa.Table]) -> pa.Table:
    p, a = tables["persons"], tables["auctions"]
    left = pa.table(
        {"person_id": p["id"], "name": p["name"], "window_start": _window(p["date_time"])}
    )
    right = pa.table(
        {"seller": a["seller"], "window_start": _window(a["date_time"]), "auction_id": a["id"]}
    )
    joined = left.join(right, ["person_id", "window_start"], ["seller", "window_start"], "inner")
    return joined.select(list(ANSWER_COLUMNS["q8"]))


def _q9(tables: dict[str, pa.Table]) -> pa.Table:
    a, b = tables["auctions"], tables["bids"]
    left = pa.table({"auction_id": a["id"], "opened": a["date_time"], "expires": a["expires"]})
    right = pa.table(
        {
            "auction": b["auction"],
            "bidder": b["bidder"],
            "price": b["price"],
            "bid_time": b["date_time"],
        }
    )
    joined = left.join(right, "auction_id", "auction", "inner")
    after = pc.subtract(joined["bid_time"], joined["opened"])
    keep = pc.and_(
        pc.and_(pc.greater_equal(after, 0), pc.less_equal(after, Q9_BOUND_MS)),
        pc.less_equal(joined["bid_time"], joined["expires"]),
    )
    return joined.filter(keep).select(list(ANSWER_COLUMNS["q9"]))


def _asof(tables: dict[str, pa.Table]) -> pa.Table:
    orders, rates = tables["orders"], tables["rates"]
    order_currency = orders["currency"].to_numpy(zero_copy_only=False).astype(str)
    order_time = orders["date_time"].to_numpy()
    rate_currency = rates["currency"].to_numpy(zero_copy_only=False).astype(str)
    rate_time, rate_value = rates["date_time"].to_numpy(), rates["rate"].to_numpy()
    found = np.full(len(order_time), -1, dtype=np.int64)
    for currency in np.unique(order_currency):
        mine = np.flatnonzero(rate_currency == currency)
        mine = mine[np.argsort(rate_time[mine], kind="stable")]
        wanted = np.flatnonzero(order_currency == currency)
        at = np.searchsorted(rate_time[mine], order_time[wanted], side="right") - 1
        found[wanted] = np.where(at >= 0, mine[np.maximum(at, 0)], -1)
    missing = found < 0
    take = pa.array(np.maximum(found, 0))
    return pa.table(
        {
            "order_id": orders["order_id"],
            "currency": orders["currency"],
            "amount": orders["amount"],
            "order_time": orders["date_time"],
            "rate": pa.array(rate_value[take.to_numpy()], mask=missing),
            "rate_time": pa.array(rate_time[take.to_numpy()], mask=missing),
        }
    )


REFERENCE = {"q3": _q3, "q8": _q8, "q9": _q9, "asof": _asof}


# ----------------------------------------------------------------------------- per record


def python_answers(inp: JoinsInput, queries: Iterable[str]) -> dict[str, list[tuple]]:
    """The same answers one record at a time (dicts and ``bisect``), as lists of tuples."""
    answers: dict[str, list[tuple]] = {}
    for query in queries:
        rows = {s: t.to_pylist() for s, t in read_inputs(inp, query).items()}
        answers[query] = PER_RECORD[query](rows)
    return answers


def _py_q3(rows: dict[str, list[dict]]) -> list[tuple]:
    local = {p["id"]: p for p in rows["persons"] if p["state"] in Q3_STATES}
    return [
        (
            local[a["seller"]]["name"],
            local[a["seller"]]["city"],
            local[a["seller"]]["state"],
            a["id"],
        )
        for a in rows["auctions"]
        if a["category"] == Q3_CATEGORY and a["seller"] in local
    ]


def _py_q8(rows: dict[str, list[dict]]) -> list[tuple]:
    people: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for p in rows["persons"]:
        start = p["date_time"] // Q8_WINDOW_MS * Q8_WINDOW_MS
        people[p["id"], start].append(p)
    out = []
    for a in rows["auctions"]:
        start = a["date_time"] // Q8_WINDOW_MS * Q8_WINDOW_MS
        out += [(p["id"], p["name"], start, a["id"]) for p in people.get((a["seller"], start), [])]
    return out


def _py_q9(rows: dict[str, list[dict]]) -> list[tuple]:
    auctions: dict[int, list[dict]] = defaultdict(list)
    for a in rows["auctions"]:
        auctions[a["id"]].append(a)
    out = []
    for b in rows["bids"]:
        for a in auctions.get(b["auction"], []):
            t = b["date_time"]
            if a["date_time"] <= t <= a["date_time"] + Q9_BOUND_MS and t <= a["expires"]:
                out.append((a["id"], b["bidder"], b["price"], t, a["expires"]))
    return out


def _py_asof(rows: dict[str, list[dict]]) -> list[tuple]:
    versions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows["rates"]:
        versions[r["currency"]].append((r["date_time"], r["rate"]))
    for kept in versions.values():
        kept.sort()
    out = []
    for o in rows["orders"]:
        kept = versions.get(o["currency"], [])
        at = bisect.bisect_right(kept, (o["date_time"], float("inf"))) - 1
        rate, time = kept[at][1] if at >= 0 else None, kept[at][0] if at >= 0 else None
        out.append((o["order_id"], o["currency"], o["amount"], o["date_time"], rate, time))
    return out


PER_RECORD = {"q3": _py_q3, "q8": _py_q8, "q9": _py_q9, "asof": _py_asof}


def rows_table(query: str, rows: list[tuple], like: pa.Table) -> pa.Table:
    """Rows (of :func:`python_answers`) as a table of the reference's schema."""
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in ANSWER_COLUMNS[query]]
    return pa.table(
        {
            name: pa.array(list(values), like.schema.field(name).type)
            for name, values in zip(ANSWER_COLUMNS[query], columns, strict=True)
        }
    )


# ----------------------------------------------------------------------------- checking


def canonical(table: pa.Table, columns: tuple[str, ...], expected: pa.Table) -> np.ndarray:
    """``table``'s rows as an int64 matrix sorted by row: integers as they are (timestamps
    as epoch ms), strings as their index among ``expected``'s values of that column
    (:data:`ABSENT` if it has none such), nulls as :data:`NULL`."""
    matrix = np.empty((table.num_rows, len(columns)), dtype=np.int64)
    for j, name in enumerate(columns):
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            values = pc.unique(expected.column(name).cast(column.type)).drop_null()
            codes = pc.fill_null(pc.index_in(column, value_set=values), ABSENT).cast(pa.int64())
            codes = pc.if_else(pc.is_null(column), pa.scalar(NULL, pa.int64()), codes)
        elif pa.types.is_timestamp(column.type):
            codes = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
        else:
            codes = column.cast(pa.int64())
        matrix[:, j] = pc.fill_null(codes, NULL).to_numpy()
    if len(matrix):
        matrix = matrix[np.lexsort(matrix.T[::-1])]
    return matrix


def compare(answer: pa.Table, expected: pa.Table, query: str) -> dict:
    """Whether ``answer`` holds exactly ``expected``'s rows, each as many times (a multiset),
    and if not, how many rows are missing and unexpected, with a few of each."""
    columns = ANSWER_COLUMNS[query]
    absent = [c for c in columns if c not in answer.column_names]
    if absent:
        return {"verified": False, "rows": answer.num_rows, "error": f"no column {absent}"}
    got, want = canonical(answer, columns, expected), canonical(expected, columns, expected)
    check = {"rows": len(got), "expected_rows": len(want)}
    if got.shape == want.shape and np.array_equal(got, want):
        return {"verified": True, **check, "missing_rows": 0, "unexpected_rows": 0}
    missing, unexpected = _minus(want, got), _minus(got, want)
    return {
        "verified": False,
        **check,
        "missing_rows": len(missing),
        "unexpected_rows": len(unexpected),
        "missing_examples": missing[:3].tolist(),
        "unexpected_examples": unexpected[:3].tolist(),
        "examples_note": "rows as compared: strings as codes, nulls as int64 min",
    }


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rows of multiset ``a`` beyond those of ``b`` (each row as often as ``a`` has it
    more than ``b``)."""
    if not len(a):
        return a
    width = a.shape[1]
    void = np.dtype((np.void, 8 * width))
    rows_a, count_a = np.unique(np.ascontiguousarray(a).view(void).ravel(), return_counts=True)
    rows_b, count_b = np.unique(np.ascontiguousarray(b).view(void).ravel(), return_counts=True)
    at = np.searchsorted(rows_b, rows_a)
    at = np.minimum(at, max(len(rows_b) - 1, 0))
    has = (rows_b[at] == rows_a) if len(rows_b) else np.zeros(len(rows_a), bool)
    extra = count_a - np.where(has, count_b[at] if len(rows_b) else 0, 0)
    keep = extra > 0
    return np.repeat(rows_a[keep], extra[keep]).view(np.int64).reshape(-1, width)
