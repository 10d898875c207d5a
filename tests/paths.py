"""Where the tests are. They are grouped like the code (one folder a group, each a pytest
marker of the same name: ``pytest -m protocol`` runs that group alone); a test module may use
another's helpers by name (``from test_loops import ...``), so every group's folder is on the
import path: of the tests here (``conftest.py``), and of the processes they start (Spark's
Python workers, a driver in a process of its own)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
GROUPS = ("protocol", "sim", "runtime", "jobs", "connectors", "spark", "tools")
"""The groups, from the bottom of the house up: protocol, simulator, runtime pieces, whole
jobs on the thread launcher, the connectors against real servers, jobs on Spark, the command
line and the report."""
SCENARIOS = TESTS / "scenarios"
"""Hand-derived scenarios of the simulator, with their expected output."""


def import_path() -> list[str]:
    """The folders a process needs on ``sys.path`` to import any test module by name."""
    return [str(TESTS), *(str(TESTS / group) for group in GROUPS)]
