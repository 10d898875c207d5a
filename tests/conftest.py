"""Shared test configuration.

Hypothesis runs derandomized in CI (CI=true), so that a CI run is
reproducible, and explores fresh examples (with its example database) on a
developer's machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# Every checkpoint a test's job takes is verified in full as soon as it is written (every file
# read and checked, the channel state counted, the cut checked channel by channel): see
# runtime/verify.py and the fixture below.
os.environ["CUTLINE_VERIFY_CHECKPOINTS"] = "1"

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def spark():
    """One real local Spark session (local[4]) for the whole test session.

    The workers import the test modules' functions by name, so the tests folder goes on
    their PYTHONPATH before Spark starts.
    """
    tests = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (tests, os.environ.get("PYTHONPATH")) if p
    )
    from cutline.spark.launcher import local_session

    session = local_session(4)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _every_checkpoint_verified():
    """Fail the test if any checkpoint its jobs took failed verification."""
    from cutline.runtime.driver import driver

    assert driver.VERIFY_EVERY_CHECKPOINT
    failures = driver.VERIFICATION_FAILURES
    failures.clear()
    yield
    assert not failures, "checkpoints failed verification:\n" + "\n".join(failures)


def pytest_sessionfinish(session):
    """An xdist worker hands its count of verified checkpoints to the controller."""
    from cutline.runtime.driver import driver

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["verified_checkpoints"] = driver.VERIFIED_CHECKPOINTS[0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(The controller, with pytest-xdist) a worker's verified checkpoints."""
    from cutline.runtime.driver import driver

    driver.VERIFIED_CHECKPOINTS[0] += int(node.workeroutput.get("verified_checkpoints", 0))


def pytest_terminal_summary(terminalreporter):
    from cutline.runtime.driver import driver

    terminalreporter.write_line(
        f"cutline: {driver.VERIFIED_CHECKPOINTS[0]} checkpoints taken by the tests' jobs were "
        "verified (files intact, a consistent cut on every channel)"
    )
