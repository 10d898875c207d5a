"""The one path every operator takes (``transform``), a user's own operators on it, and the
operators' ids: stable under changes elsewhere in the job, refused when two would be equal,
and named in the error of a checkpoint that does not fit."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_runtime_jobs import FailAfterCheckpoint, environment, mark_checkpoints

from cutline import (
    Logic,
    OperatorContext,
    RestoreError,
    RunningOperator,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.runtime.task.local import ThreadLauncher

N = 400


# ------------------------------------------------------------------- a user's own operators


@dataclass(frozen=True)
class Scale(Logic):
    """Multiplies ``value`` by ``factor``: a stateless operator of the user's own."""

    factor: int

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Scaling(self.factor)


class _Scaling(RunningOperator):
    def __init__(self, factor: int) -> None:
        self.factor = factor

    def process(self, batch: Any) -> Any:
        rows = batch if isinstance(batch, list) else batch.to_pylist()
        return [{**row, "value": row["value"] * self.factor} for row in rows]


@dataclass(frozen=True)
class Numbering(Logic):
    """Numbers the records each subtask sees, 1, 2, ...: its count is state of its own, in
    every checkpoint and restored after a failure (at the same parallelism)."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Numbering(ctx.subtask, state or 0)


class _Numbering(RunningOperator):
    def __init__(self, subtask: int, seen: int) -> None:
        self.subtask, self.seen = subtask, seen

    def process(self, batch: Any) -> Any:
        rows = batch if isinstance(batch, list) else batch.to_pylist()
        out = []
        for row in rows:
            self.seen += 1
            out.append({"subtask": self.subtask, "seen": self.seen, "value": row["value"]})
        return out

    def snapshot(self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False):
        return self.seen


@dataclass(frozen=True)
class WhereAmI(Logic):
    """Tags each record with the subtask that processed it."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Tagging(ctx.subtask)


class _Tagging(RunningOperator):
    def __init__(self, subtask: int) -> None:
        self.subtask = subtask

    def process(self, batch: Any) -> Any:
        rows = batch if isinstance(batch, list) else batch.to_pylist()
        return [{**row, "subtask": self.subtask} for row in rows]


def test_a_users_operator_runs_end_to_end(tmp_path: Path) -> None:
    env = environment(tmp_path, 2)
    env.from_sequence(0, N).transform("scale(3)", Scale(3)).map(lambda r: r["value"]).collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == [] and result.checkpoints[-1].final
    assert sorted(result.output) == [3 * v for v in range(N)]
    (chain,) = env.plan().chains
    assert chain.name == "sequence -> scale(3) -> map(lambda) -> collect(collect)"


def test_a_users_operator_on_a_keyed_stream_sees_each_key_in_one_subtask(tmp_path: Path) -> None:
    env = environment(tmp_path, 3)
    (
        env.from_sequence(0, N)
        .map(lambda r: {"key": r["value"] % 10, "value": r["value"]})
        .key_by("key")
        .transform("where", WhereAmI(), name="where")
        .collect()
    )
    result = testing.execute(env, launcher=ThreadLauncher())
    subtasks: defaultdict[int, set[int]] = defaultdict(set)
    for row in result.output:
        subtasks[row["key"]].add(row["subtask"])
    assert sorted(r["value"] for r in result.output) == list(range(N))
    assert all(len(s) == 1 for s in subtasks.values()), subtasks
    assert len(set().union(*subtasks.values())) > 1  # the keys are spread over the subtasks


def test_a_users_operator_state_is_restored_after_a_failure(tmp_path: Path) -> None:
    """The failure comes after a checkpoint completed: without its state restored the
    numbering would start again at 1, and some numbers would come twice."""
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed-once"
    env = environment(tmp_path, 2, batch_size=2)
    (
        env.from_sequence(0, N)
        .transform("numbering", Numbering(), name="numbering")
        .map(FailAfterCheckpoint(str(marker), str(flag)))
        .collect()
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=mark_checkpoints(marker),
        hold_sources=SourceHold(records=N // 4),
    )
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    assert sorted(r["value"] for r in result.output) == list(range(N))
    seen = Counter(r["subtask"] for r in result.output)
    assert Counter((r["subtask"], r["seen"]) for r in result.output) == Counter(
        (s, i) for s, n in seen.items() for i in range(1, n + 1)
    )


def test_transform_takes_a_logic_and_a_label() -> None:
    stream = StreamEnvironment(2).from_sequence(0, 10)
    with pytest.raises(
        TypeError, match=r"dedupe: transform takes a cutline\.runtime\.operators\.Logic"
    ):
        stream.transform("dedupe", lambda batch: batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the label must be a non-empty string"):
        stream.transform("", Scale(2))
    with pytest.raises(ValueError, match="scale: on_error must be 'fail' or 'dead_letter'"):
        stream.transform("scale", Scale(2), on_error="ignore")


# ------------------------------------------------------------------------------- operator ids


def job(env: StreamEnvironment, extra: bool = False) -> dict[str, str]:
    """A keyed sum behind a map; with ``extra``, unrelated operators added before it and in
    between. Returns operator name -> id."""
    if extra:
        env.from_sequence(0, 5, name="other").map(str).collect("other")
    source = env.from_sequence(0, 100)
    if extra:
        source.filter(lambda r: True).collect("side")
    source.map(lambda r: {"key": r["value"] % 3, "value": 1}).key_by("key").sum("value").collect()
    return {op.name: uid for uid, op in env.graph.operators.items()}


def test_an_unnamed_operators_id_does_not_depend_on_other_operators() -> None:
    alone = job(StreamEnvironment(2))
    among_others = job(StreamEnvironment(2), extra=True)
    for name, uid in alone.items():
        assert among_others[name] == uid, name
    assert re.fullmatch(r"sum_value-[0-9a-f]{8}", alone["sum(value)"])
    assert re.fullmatch(r"sequence-[0-9a-f]{8}", alone["sequence"])


def test_an_operators_id_follows_its_own_function_and_its_inputs() -> None:
    env = StreamEnvironment(2)
    numbers = env.from_sequence(0, 100)
    keyed = numbers.map(lambda r: {"key": r["value"] % 3, "value": 1})
    by_key, by_value = keyed.key_by("key").sum("value"), keyed.key_by("value").sum("value")
    other_numbers = env.from_sequence(0, 50)  # another range: another source
    ids = [s.operator.uid for s in (numbers, other_numbers, by_key, by_value)]
    assert len(set(ids)) == 4
    assert keyed.key_by("key").max("value").operator.uid.startswith("max_value-")


def test_two_operators_that_would_have_one_id_are_refused_asking_for_names() -> None:
    env = StreamEnvironment(2)
    numbers = env.from_sequence(0, 100)
    numbers.map(lambda r: r)
    with pytest.raises(ValueError, match=r"map\(lambda\): .*same input.*give them name="):
        numbers.map(lambda r: r)
    numbers.map(lambda r: r, name="second")  # named: its own id
    with pytest.raises(ValueError, match=r"name='second': another operator .* has this name"):
        numbers.filter(lambda r: True, name="second")
    with pytest.raises(ValueError, match=r"sequence: .*give them name="):
        env.from_sequence(0, 100)  # the same range again


def test_a_name_is_the_operators_id_and_its_name() -> None:
    env = StreamEnvironment(2)
    summed = env.from_sequence(0, 10, name="numbers").key_by("value").sum("value", name="sums")
    assert (summed.operator.uid, summed.operator.name) == ("sums", "sums")
    assert env.plan().subtasks()[:2] == ["numbers-0", "numbers-1"]


def test_a_checkpoint_of_other_ids_names_its_operators_and_the_jobs_without_state(
    tmp_path: Path,
) -> None:
    def build(directory: str, sum_name: str | None) -> StreamEnvironment:
        env = environment(tmp_path / directory, 2)
        numbers = env.from_sequence(0, 50, name="numbers")
        summed = numbers.key_by("value").sum("value", name=sum_name)
        summed.write_jsonl(tmp_path / directory / "out", name="out")
        return env

    first = build("first", "3-sum_value_")  # as the positional ids of earlier versions
    testing.execute(first, launcher=ThreadLauncher())
    second = build("second", None)
    summed = next(op for op in second.graph.operators.values() if op.name == "sum(value)")
    with pytest.raises(RestoreError) as info:
        testing.execute(
            second, launcher=ThreadLauncher(), restore_from=tmp_path / "first" / "checkpoints"
        )
    message = str(info.value)
    assert "holds state of operator(s) '3-sum_value_', which this job does not have" in message
    assert f"without state in it are '{summed.uid}' (sum(value))" in message
    assert "'numbers'" not in message.split("without state in it are")[1]  # it has its state
    assert "name=..." in message and "allow_non_restored_state=True" in message
