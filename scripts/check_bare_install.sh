#!/usr/bin/env bash
# A bare install works: `pip install .` (no extras) into an empty venv must import every module
# of cutline, run the CLI and run a small job on local Spark. `make test` runs this, so a
# module-level import of a package that is only a dev extra (or no dependency at all) fails CI.
#
# Usage: scripts/check_bare_install.sh [PYTHON]      (default: python3)
set -euo pipefail
python=${1:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cutline-bare.XXXXXX")
cleanup() {
    # Spark's JVM outlives the Python that started it by a moment: let it end (and end it if
    # it does not) before its jars are removed under it
    for _ in $(seq 1 100); do
        pgrep -f "$work/venv" > /dev/null || break
        sleep 0.1
    done
    pkill -KILL -f "$work/venv" 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$python" -m venv "$work/venv"
# the project's files as they are in the checkout (tracked ones only: no build/ or egg-info)
(cd "$root" && git ls-files -z src pyproject.toml README.md | tar --null -T - -cf -) \
    | tar -xf - -C "$work"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$work" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
"$work/venv/bin/python" -c "import cutline" # the install itself must have worked

cd "$work"  # not the checkout: the installed package, not src/, is imported
echo "bare install: every module of cutline imports"
"$work/venv/bin/python" - <<'EOF'
import importlib
import pkgutil

import cutline

names = [m.name for m in pkgutil.walk_packages(cutline.__path__, "cutline.")]
for name in names:
    importlib.import_module(name)
print(f"  {len(names)} modules")
EOF
echo "bare install: the package says it is typed (py.typed, PEP 561)"
"$work/venv/bin/python" -c "
import pathlib, cutline
assert (pathlib.Path(cutline.__file__).parent / 'py.typed').is_file(), 'py.typed is not installed'
"
echo "bare install: the CLI runs"
"$work/venv/bin/cutline" --help > /dev/null
"$work/venv/bin/cutline" checkpoints --help > /dev/null
"$work/venv/bin/cutline" sim --demo --seed 1 > /dev/null 2>&1
echo "bare install: a small job runs on local Spark"
"$work/venv/bin/python" - 2> "$work/job.err" <<'EOF' || { cat "$work/job.err"; exit 1; }
from cutline import StreamEnvironment

env = StreamEnvironment(parallelism=2, checkpoint_interval="200ms")
(env.from_sequence(0, 20_000)
    .map(lambda r: {"k": r["value"] % 7, "v": r["value"]})
    .key_by("k")
    .sum("v")
    .collect())
result = env.execute(progress=False)
assert len(result.output) == 20_000, len(result.output)
ends = {}
for record in result.output:
    ends[record["k"]] = max(ends.get(record["k"], 0), record["v"])
assert ends == {k: sum(range(k, 20_000, 7)) for k in range(7)}, ends
print(f"  {len(result.output):,} running sums exact, {len(result.checkpoints)} checkpoint(s)")
EOF
echo "bare install: OK"
