"""Shared test configuration.

Hypothesis runs derandomized in CI (CI=true), so that a CI run is
reproducible, and explores fresh examples (with its example database) on a
developer's machine.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))
from paths import GROUPS, TESTS, import_path

from server_fixtures import kafka_broker, postgres  # noqa: F401 (fixtures of every group)

sys.path[:0] = [p for p in import_path() if p not in sys.path]

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
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (*import_path(), os.environ.get("PYTHONPATH")) if p
    )
    from cutline.spark.launcher import local_session

    session = local_session(4)
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _verify_every_checkpoint():
    """Every job of the session verifies each checkpoint it writes (see
    ``checkpoint_verification.py``), through its ``checkpoint_written`` hook."""
    from checkpoint_verification import verify_written
    from cutline.runtime.driver.driver import JobDriver

    original = JobDriver.__init__

    def with_the_hook(self, plan, config, *args, **kwargs):
        if config.checkpoint_written is None:
            config = dataclasses.replace(config, checkpoint_written=verify_written)
        original(self, plan, config, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JobDriver, "__init__", with_the_hook)
        yield


@pytest.fixture(autouse=True)
def _every_checkpoint_verified():
    """Fail the test if any checkpoint its jobs took failed verification."""
    from checkpoint_verification import FAILURES

    FAILURES.clear()
    yield
    assert not FAILURES, "checkpoints failed verification:\n" + "\n".join(FAILURES)


def pytest_sessionfinish(session):
    """An xdist worker hands its count of verified checkpoints to the controller."""
    from checkpoint_verification import VERIFIED

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["verified_checkpoints"] = VERIFIED[0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(The controller, with pytest-xdist) a worker's verified checkpoints."""
    from checkpoint_verification import VERIFIED

    VERIFIED[0] += int(node.workeroutput.get("verified_checkpoints", 0))


def pytest_terminal_summary(terminalreporter):
    from checkpoint_verification import VERIFIED

    terminalreporter.write_line(
        f"cutline: {VERIFIED[0]} checkpoints taken by the tests' jobs were "
        "verified (files intact, a consistent cut on every channel)"
    )


def pytest_collection_modifyitems(items):
    """Each test carries the marker of its group (its folder): ``pytest -m jobs``."""
    for item in items:
        folder = Path(item.path).resolve().parent
        if folder.parent == TESTS and folder.name in GROUPS:
            item.add_marker(getattr(pytest.mark, folder.name))
