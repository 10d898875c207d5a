"""B1 and B2 (and Nexmark) of two revisions of cutline, side by side: did a change make them
slower?

    .venv/bin/python bench/compare_revisions.py --base REV [--rounds 2] [--repeats 3]
        [--nexmark] [--out bench/results/b1_b2_revisions.json]

The base revision is checked out into a temporary git worktree; each round runs
``bench/b1_b2.py`` (each revision's own copy, so each measures itself the way it was
measured), and with ``--nexmark`` cutline's runs of ``bench/nexmark.py`` on the large input
(q5, q7, q11), for the base and for the working tree, interleaved (the head first every other
round), in the same venv and on the same machine minutes apart, with the revision's ``src``
first on ``PYTHONPATH``. Every
run verifies its own output (b1_b2's rule: an unverified figure does not count).

The JSON holds, per system of B1 and B2 and per revision, the median of each figure over
every run of every round, and the ratio head / base; the table prints the same. A ratio is
only as good as the spread of its runs (each run's figures are in the JSON): expect 10-30%
between runs of one configuration on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("events_per_s", "events_per_s_incl_start", "checkpoint_duration_p50_s", "recovery_s")
"""The figures compared (those of b1_b2's results that a revision could make worse)."""


def _run(tree: Path, repeats: int, out: Path, nexmark: bool) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    subprocess.run(
        [sys.executable, "bench/b1_b2.py", "--repeats", str(repeats), "--out", str(out)],
        cwd=tree,
        env=env,
        check=True,
    )
    results: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    if nexmark:  # cutline's queries only, on the large input (cached between the runs)
        queries = out.with_suffix(".nexmark.json")
        command = [sys.executable, "bench/nexmark.py", "--size", "large", "--systems"]
        command += ["cutline", "--no-flink", "--repeats", str(repeats), "--out", str(queries)]
        subprocess.run(command, cwd=tree, env=env, check=False)  # (exit 1: a run unverified)
        results += json.loads(queries.read_text())["results"]
    return results


def _runs(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """(benchmark system) -> figure -> every run's value, of the verified results only."""
    found: dict[str, dict[str, list[float]]] = {}
    for result in results:
        if not result.get("verified", False):
            continue
        key = f"{result['name']}: {result['system']}"
        for name, figure in result["figures"].items():
            if name in FIGURES and isinstance(figure, dict) and figure.get("values"):
                found.setdefault(key, {}).setdefault(name, []).extend(figure["values"])
            elif name in FIGURES and isinstance(figure, dict) and figure.get("median") is not None:
                found.setdefault(key, {}).setdefault(name, []).append(figure["median"])
            elif name in FIGURES and isinstance(figure, int | float):
                found.setdefault(key, {}).setdefault(name, []).append(float(figure))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/b1_b2_revisions.json"))
    parser.add_argument(
        "--nexmark",
        action="store_true",
        help="Nexmark's queries too (cutline's runs of bench/nexmark.py on the large input)",
    )
    args = parser.parse_args()

    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    base = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="cutline-revisions-"))
    base_tree = work / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True
    )
    runs: dict[str, dict[str, dict[str, list[float]]]] = {"base": {}, "head": {}}
    try:
        for round_ in range(args.rounds):
            order = [("base", base_tree), ("head", ROOT)]
            if round_ % 2:  # every other round the head goes first: no side always runs second
                order.reverse()
            for side, tree in order:
                out = work / f"{side}-{round_}.json"
                for key, figures in _runs(_run(tree, args.repeats, out, args.nexmark)).items():
                    for name, values in figures.items():
                        runs[side].setdefault(key, {}).setdefault(name, []).extend(values)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT)

    rows = []
    what = "B1, B2 and Nexmark" if args.nexmark else "B1 and B2"
    table = Table(title=f"{what}: {base} (base) against {head} (head), {args.rounds} rounds")
    for column in ("benchmark: system", "figure", "base median", "head median", "head / base"):
        table.add_column(column, justify="left" if column.startswith("bench") else "right")
    for key in sorted(set(runs["base"]) & set(runs["head"])):
        for name in FIGURES:
            before, after = runs["base"][key].get(name), runs["head"][key].get(name)
            if not before or not after:
                continue
            ratio = statistics.median(after) / statistics.median(before)
            rows.append(
                {
                    "system": key,
                    "figure": name,
                    "base": {"median": statistics.median(before), "runs": before},
                    "head": {"median": statistics.median(after), "runs": after},
                    "head_over_base": ratio,
                }
            )
            table.add_row(
                key,
                name,
                f"{statistics.median(before):,.3f}",
                f"{statistics.median(after):,.3f}",
                f"{ratio:.3f}",
            )
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": f"{what} of two revisions, interleaved (bench/compare_revisions.py)",
                "base": base,
                "head": head,
                "rounds": args.rounds,
                "repeats": args.repeats,
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                "results": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
