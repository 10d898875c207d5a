"""The ``cutline`` command line.

Exit status: 0 when everything asked for worked and every snapshot verified,
1 when a snapshot failed verification, 2 on bad input (a malformed file, a bad
option, an output that cannot be written).
"""

from __future__ import annotations

import json
import math
import os
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cutline import __version__
from cutline.cli_checkpoints import checkpoints, report
from cutline.runtime.durations import seconds
from cutline.sim.checker import simulate_and_check
from cutline.sim.output import format_snapshots, run_to_dict
from cutline.sim.scenario import Scenario, ScenarioError, load_scenario
from cutline.sim.simulator import SimConfig

if TYPE_CHECKING:
    from cutline.api.setting_groups import HostLossPolicy

EXIT_OK, EXIT_UNVERIFIED, EXIT_BAD_INPUT = 0, 1, 2


def _fail(message: str) -> None:
    click.echo(f"cutline: error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """An option's duration, in seconds: text with a unit (``30s``, ``500ms``, ``2min``), or a
    number of seconds (:mod:`cutline.runtime.durations`); positive and finite."""
    option = f"--{(param.name or 'duration').replace('_', '-')}"
    text = str(value).strip()
    try:
        found = float(text)  # (a number on the command line: seconds)
    except ValueError:
        try:
            found = seconds(text, option) or 0.0
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    if not 0 < found < math.inf:
        raise click.BadParameter(f"{option}={value!r} must be a positive duration", ctx, param)
    return found


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cutline")
def main() -> None:
    """cutline: consistent distributed snapshots, simulated and for real."""


def _demo_scenario() -> Scenario:
    folder = resources.files("cutline.sim") / "scenarios"
    with resources.as_file(folder) as path:
        return load_scenario(path / "bank.top", path / "bank.events")


@main.command()
@click.argument("topology", required=False, type=click.Path(path_type=Path))
@click.argument("events", required=False, type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the message delays.")
@click.option(
    "--diagram",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the space-time diagram to this .png or .svg file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print snapshots and verdict as JSON.")
@click.option("--min-delay", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-delay", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--demo", is_flag=True, help="Run the bundled bank scenario instead of files.")
def sim(
    topology: Path | None,
    events: Path | None,
    seed: int,
    diagram: Path | None,
    as_json: bool,
    min_delay: int,
    max_delay: int,
    demo: bool,
) -> None:
    """Simulate Chandy-Lamport snapshots of the token bank in TOPOLOGY driven by EVENTS.

    Prints the snapshots on standard output (or, with --json, one JSON object with
    the snapshots, the run's statistics and the verdict), and a one-line verdict of
    the independent checker on standard error. The same seed always gives the same
    output.

    The snapshots' text format (the simulator page's "Snapshot output" section): one block
    per snapshot, blocks separated by a blank line; a block is the snapshot's id,
    then "ID TOKENS" for every process (the balance it recorded), then "SRC DST
    token(K)" for every message recorded in flight on a channel, in the order its
    destination received it. A snapshot that could not complete has a line
    "# incomplete: ..." after its id.

    The TOPOLOGY and EVENTS files are described in the simulator page's "Topology file"
    and "Events file" sections (docs/simulator.md); --demo runs a bundled example of both.

    Exit status: 0 every snapshot verified; 1 a snapshot failed a property; 2 bad
    input (a malformed file, a bad option, a diagram that cannot be written).
    """
    if demo and (topology or events):
        raise click.UsageError("give either --demo or TOPOLOGY and EVENTS, not both")
    if not demo and (topology is None or events is None):
        raise click.UsageError("missing TOPOLOGY and EVENTS files (or use --demo)")
    if min_delay > max_delay:
        raise click.UsageError(f"--min-delay {min_delay} is larger than --max-delay {max_delay}")
    if diagram is not None:
        from cutline.sim.diagram import FORMATS

        if diagram.suffix.lower() not in FORMATS:
            raise click.UsageError(
                f"--diagram {diagram}: unknown format {diagram.suffix or '(none)'!r}; "
                f"use one of {', '.join(FORMATS)}"
            )
    try:
        if demo:
            scenario = _demo_scenario()
        else:
            assert topology is not None and events is not None
            scenario = load_scenario(topology, events)
        run, verdict = simulate_and_check(
            scenario, SimConfig(seed=seed, min_delay=min_delay, max_delay=max_delay)
        )
    except ScenarioError as exc:
        _fail(str(exc))
        return
    if diagram is not None:
        from cutline.sim.diagram import draw_diagram

        try:
            draw_diagram(run, diagram)
        except OSError as exc:
            _fail(f"cannot write the diagram to {diagram}: {exc.strerror or exc}")
    if as_json:
        click.echo(json.dumps(run_to_dict(run, verdict), indent=2))
    else:
        click.echo(format_snapshots(run), nl=False)
    click.echo(verdict.summary(), err=True)
    if not verdict.ok:
        for violation in verdict.violations[1:20]:
            click.echo(f"  {violation}", err=True)
        if len(verdict.violations) > 20:
            click.echo(f"  ... and {len(verdict.violations) - 20} more", err=True)
        sys.exit(EXIT_UNVERIFIED)


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-output"),
    show_default=True,
    help="Where the input, the checkpoints and the output go.",
)
@click.option("--events", type=click.IntRange(min=10_000), default=2_000_000, show_default=True)
@click.option("--no-kill", is_flag=True, help="Do not kill a worker.")
@click.option(
    "--master",
    help="Run on this Spark master (spark://HOST:7077, yarn, k8s://...) instead of local "
    "Spark; --workdir must then be a path every host sees.",
)
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting for the session --master makes (repeatable), e.g. "
    "spark.driver.host=10.0.0.1.",
)
@click.option(
    "--parallelism", type=click.IntRange(min=1), default=2, show_default=True, help="Subtasks."
)
@click.option(
    "--kill-command",
    metavar="COMMAND",
    help="Instead of killing a local Python worker: run COMMAND once the first checkpoint is "
    "complete, {host} replaced by the host of the last slot, e.g. "
    "'scripts/cluster.sh kill-worker {host}'.",
)
@click.option(
    "--on-host-loss",
    type=click.Choice(["restart", "wait"]),
    default="restart",
    show_default=True,
    help="After a lost host: restart at once on the others, or wait for it to come back.",
)
@click.option(
    "--heartbeat-timeout",
    metavar="DURATION",
    default="30s",
    callback=_duration,
    show_default=True,
    help="How long without a heartbeat before a slot is declared lost (a host cut off): "
    "a duration (30s, 2min) or seconds.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    help="Read at most this many events per second (a longer demo to watch, or a load test).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Start from the newest checkpoint in --workdir (after the driver died), keeping what "
    "was published.",
)
def demo(
    workdir: Path,
    events: int,
    no_kill: bool,
    master: str | None,
    confs: tuple[str, ...],
    parallelism: int,
    kill_command: str | None,
    on_host_loss: HostLossPolicy,
    heartbeat_timeout: float,
    rate: float | None,
    resume: bool,
) -> None:
    """Run B1 (keyed running count) on Spark, kill a worker, recover, check the output.

    By default on local Spark, killing one Python worker; with --master on a cluster, losing
    a worker host through --kill-command.
    """
    if events % 10_000:
        _fail("--events must be a multiple of 10,000 (the number of keys)")
    settings = {}
    for conf in confs:
        key, sep, value = conf.partition("=")
        if not sep or not key.strip():
            _fail(f"--conf takes KEY=VALUE, not {conf!r}")
        settings[key.strip()] = value
    if settings and master is None:
        _fail("--conf applies to the session --master makes; give --master too")
    from cutline.demo import run_demo
    from cutline.runtime.checkpoint.restore import RestoreError
    from cutline.runtime.driver.result import JobFailedError
    from cutline.spark.launcher import SparkSetupError, cluster_session

    spark = None
    if master is not None:
        try:
            spark = cluster_session(master, settings)
        except SparkSetupError as exc:
            _fail(str(exc))
    try:
        _, verdict = run_demo(
            workdir,
            events=events,
            kill=not no_kill,
            spark=spark,
            parallelism=parallelism,
            kill_command=kill_command,
            resume=resume,
            on_host_loss=on_host_loss,
            heartbeat_timeout=heartbeat_timeout,
            rate=rate,
        )
    except (RestoreError, FileNotFoundError, ValueError, SparkSetupError) as exc:
        _fail(str(exc))
    except JobFailedError as exc:
        _fail(f"the demo's job failed: {exc}")
    sys.exit(EXIT_OK if verdict.exact else EXIT_UNVERIFIED)


@main.command()
@click.argument("checkpoint_dir")
@click.option(
    "--target",
    "-d",
    help="Directory to put the savepoint in (default: CHECKPOINT_DIR/savepoints).",
)
@click.option(
    "--cancel",
    is_flag=True,
    help="Stop the job once the savepoint is complete (everything read before it is "
    "published; a job restored from it goes on from there).",
)
@click.option(
    "--timeout",
    metavar="DURATION",
    default="10min",
    callback=_duration,
    show_default=True,
    help="How long to wait for the savepoint: a duration (30s, 10min) or seconds.",
)
def savepoint(checkpoint_dir: str, target: str | None, cancel: bool, timeout: float) -> None:
    """Take a savepoint of the job running with CHECKPOINT_DIR, and print its folder.

    A savepoint is a checkpoint you own: it is never deleted by cutline, it holds all its
    state (move or copy it anywhere), and any job can start from it with
    ``execute(restore_from=FOLDER)``, at any parallelism.
    """
    from cutline.runtime.driver.client import JobClient, JobClientError

    if target is not None and "://" not in target:
        target = os.path.abspath(target)  # the job's driver may run elsewhere than here
    try:
        path = JobClient(checkpoint_dir).savepoint(target, stop=cancel, timeout=timeout)
    except JobClientError as exc:
        _fail(str(exc))
    click.echo(path)


main.add_command(checkpoints)
main.add_command(report)


if __name__ == "__main__":  # pragma: no cover
    main()
