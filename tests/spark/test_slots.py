"""How the Spark launcher waits for a generation's task slots and for lost hosts.

The figures it reads from Spark (``slots()``: free slots, all slots, the hosts with an
executor) are replaced by a scripted sequence, so that every branch of the waiting policy is
seen; reading them from a real cluster is ``tests/test_cluster.py``'s part.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from cutline import Timeouts
from cutline.spark.launcher import SparkLauncher, is_local

Reading = tuple[int, int, frozenset[str] | None]


class ScriptedLauncher(SparkLauncher):
    """A launcher on a 'cluster' whose figures follow ``readings`` (the last one repeats)."""

    poll_interval = 0.001

    def __init__(self, readings: list[Reading], master: str = "spark://master:7077") -> None:
        super().__init__(SimpleNamespace(sparkContext=SimpleNamespace(master=master)))
        self._readings: Iterator[Reading] = iter(readings)
        self._last = readings[0]
        self.polls = 0

    def slots(self) -> Reading:
        self.polls += 1
        self._last = next(self._readings, self._last)
        return self._last


def wait(
    launcher: SparkLauncher, needed: int, hosts: set[str] = frozenset(), timeout: float = 5.0
) -> tuple[str | None, list[str]]:
    said: list[str] = []
    error = launcher.wait_for_slots(needed, frozenset(hosts), timeout, said.append)
    return error, said


A, B, C = "10.0.0.11", "10.0.0.12", "10.0.0.13"


def test_enough_free_slots_start_at_once_without_a_word() -> None:
    assert wait(ScriptedLauncher([(3, 3, frozenset({A, B, C}))]), 2) == (None, [])


def test_it_waits_for_slots_and_says_so() -> None:
    launcher = ScriptedLauncher([(1, 2, frozenset({A})), (1, 2, frozenset({A})), (2, 2, None)])
    assert wait(launcher, 2) == (
        None,
        ["waiting up to 5 s for 2 task slots (the cluster has 1 free)", "2 task slots free"],
    )
    assert launcher.polls == 3


def test_with_hosts_to_wait_for_it_waits_until_each_has_an_executor_again() -> None:
    launcher = ScriptedLauncher(
        [(2, 2, frozenset({A, B})), (2, 2, frozenset({A, B})), (3, 3, frozenset({A, B, C}))]
    )
    assert wait(launcher, 2, {B, C}) == (
        None,
        [
            f"waiting up to 5 s for host(s) {C} to come back",
            "3 task slots free and every host back",
        ],
    )


def test_both_are_named_when_both_are_missing() -> None:
    launcher = ScriptedLauncher([(1, 1, frozenset({A})), (2, 2, frozenset({A, B}))])
    _, said = wait(launcher, 2, {A, B})
    assert (
        said[0]
        == f"waiting up to 5 s for 2 task slots (the cluster has 1 free) and host(s) {B} to come back"
    )


def test_a_host_that_does_not_come_back_in_time_is_given_up_on() -> None:
    launcher = ScriptedLauncher([(2, 2, frozenset({A, B}))])
    assert wait(launcher, 2, {A, C}, timeout=0.05) == (
        None,
        [
            f"waiting up to 0.05 s for host(s) {C} to come back",
            f"host(s) {C} did not come back within 0.05 s; starting on the 2 free task slots of "
            "the others",
        ],
    )


def test_too_few_slots_after_the_timeout_fail_the_attempt_with_the_figures() -> None:
    error, said = wait(ScriptedLauncher([(1, 1, frozenset({A}))]), 2, timeout=0.05)
    assert error == (
        "the job needs 2 task slots at once (one per subtask index) and the Spark cluster had 1 "
        "free (1 in all) after waiting 0.05 s (Timeouts.slots): add executors or cores, or lower "
        "the parallelism"
    )
    assert said == ["waiting up to 0.05 s for 2 task slots (the cluster has 1 free)"]


def test_slots_that_exist_but_stay_busy_are_left_to_spark_to_queue_for() -> None:
    error, said = wait(ScriptedLauncher([(1, 2, frozenset({A, B}))]), 2, timeout=0.05)
    assert error is None
    assert said[-1] == "1 of 2 task slots free after 0.05 s; starting anyway"


def test_a_spark_that_does_not_say_where_its_executors_are_does_not_block_on_hosts() -> None:
    assert wait(ScriptedLauncher([(2, 2, None)]), 2, {C}) == (None, [])


def test_local_mode_never_waits() -> None:
    launcher = ScriptedLauncher([(0, 0, None)], master="local[2]")
    assert wait(launcher, 2, {A}) == (None, [])
    assert launcher.polls == 0


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[4, 3]", True),
        ("local-cluster[2,1,1024]", False),
        ("spark://10.77.0.1:7077", False),
        ("yarn", False),
        ("k8s://https://api:6443", False),
    ],
)
def test_which_masters_are_local(master: str, local: bool) -> None:
    assert is_local(SimpleNamespace(sparkContext=SimpleNamespace(master=master))) is local


def test_the_settings_are_checked_when_the_job_is_built() -> None:
    from cutline import StreamEnvironment

    with pytest.raises(
        ValueError, match="on_host_loss must be one of 'restart', 'wait', not 'later'"
    ):
        StreamEnvironment(on_host_loss="later")
    for bad in (-1, "forever", float("inf")):
        with pytest.raises(ValueError, match=r"Timeouts\.slots"):
            StreamEnvironment(timeouts=Timeouts(slots=bad))
    env = StreamEnvironment(timeouts=Timeouts(slots="30s"), on_host_loss="wait")
    assert (env.settings.deadlines.slots, env.settings.on_host_loss) == (30.0, "wait")
