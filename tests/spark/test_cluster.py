"""cutline on a real Spark standalone cluster whose workers are separate hosts.

``scripts/cluster.sh up`` starts a master and three workers (one task slot each), each
worker in a Linux network namespace of its own with its own address on a bridge; the driver
(``cutline demo --master spark://...``, a process of its own, as a user would run it) submits
the demo's job (B1: a keyed running count of 2,000,000 events) at parallelism 2. The tests lose
a worker host part-way (every process on it killed), with each ``on_host_loss`` policy, and
lose the driver itself; every time the published output must be exact. The cluster is torn
down at the end even when a test fails, and the teardown checks that nothing is left.

These tests need network namespaces (Linux, iproute2, root): elsewhere they are skipped with
the reason. The one that checks the script's refusal runs everywhere it can drop root. The
``on_host_loss="wait"`` and lost-driver runs take a minute each and are marked ``slow``
(``make soak``); ``make test`` runs the lost host.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cutline.demo import check_b1_output, write_b1_input
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.checkpoint.verify import verify_checkpoint

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]  # one worker: one cluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster.sh"
CUTLINE = Path(sys.executable).parent / "cutline"
NAME, SUBNET = "cltest", "10.78.0"
EVENTS, KEYS = 2_000_000, 10_000
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM settings that start the driver and the executors sooner on 2 cores (test only)."""


def netns_unavailable() -> str | None:
    """Why this machine cannot run the cluster (``None``: it can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"{NAME}-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


@dataclass
class Cluster:
    env: dict[str, str]
    master: str
    driver_host: str
    workers: list[str]

    def script(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=180
        )

    def demo(self, workdir: Path, *args: str) -> list[str]:
        """The demo's command line on this cluster."""
        return [
            str(CUTLINE),
            "demo",
            "--master",
            self.master,
            "--conf",
            f"spark.driver.host={self.driver_host}",
            "--conf",
            f"spark.driver.extraJavaOptions={QUICK_JVM}",
            "--conf",
            f"spark.executor.extraJavaOptions={QUICK_JVM}",
            "--workdir",
            str(workdir),
            "--events",
            str(EVENTS),
            *args,
        ]

    def run_demo(self, workdir: Path, *args: str) -> str:
        done = subprocess.run(
            self.demo(workdir, *args), env=self.env, capture_output=True, text=True, timeout=600
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        return done.stdout

    def leftovers(self) -> list[str]:
        """What of this cluster is still there: namespaces, the bridge, processes."""
        found = []
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        found += [n for n in namespaces.stdout.split() if n.startswith(f"{NAME}-")]
        bridge = subprocess.run(["ip", "link", "show", f"{NAME}-br"], capture_output=True)
        if bridge.returncode == 0:
            found.append(f"{NAME}-br")
        processes = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
        found += [
            line.strip()
            for line in processes.stdout.splitlines()
            if self.env["CUTLINE_CLUSTER_DIR"] in line
        ]
        return found


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("events")
    write_b1_input(directory, EVENTS, KEYS)
    return directory


@pytest.fixture
def workdir(tmp_path: Path, events: Path) -> Path:
    """A demo's working directory with its input in place (hard links to one copy)."""
    shutil.copytree(events, tmp_path / "input", copy_function=os.link)
    return tmp_path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(f"no test cluster here: {reason}")
    env = {
        **os.environ,
        "CUTLINE_CLUSTER_NAME": NAME,
        "CUTLINE_CLUSTER_SUBNET": SUBNET,
        "CUTLINE_CLUSTER_WORKERS": "3",
        "CUTLINE_CLUSTER_CORES": "1",
        "CUTLINE_CLUSTER_DIR": str(tmp_path_factory.mktemp("cluster")),
        "PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",  # the driver's lines as they come
    }
    cluster = Cluster(env, "", "", [])
    cluster.script("down")  # what a killed earlier run may have left
    try:
        up = cluster.script("up")
        assert up.returncode == 0, up.stdout + up.stderr
        settings = dict(line.split("=", 1) for line in up.stdout.split())
        cluster.master = settings["MASTER"]
        cluster.driver_host = settings["DRIVER_HOST"]
        cluster.workers = settings["WORKERS"].split(",")
        assert cluster.master == f"spark://{SUBNET}.1:7077"
        assert cluster.workers == [f"{SUBNET}.11", f"{SUBNET}.12", f"{SUBNET}.13"]
        yield cluster
    finally:
        down = cluster.script("down")
        assert down.returncode == 0, down.stderr
        assert cluster.leftovers() == []


def exact(workdir: Path) -> None:
    verdict = check_b1_output(workdir / "output", KEYS, EVENTS // KEYS)
    assert verdict.exact, (verdict.rows, verdict.wrong_keys[:5])


def verified(checkpoints: Path) -> int:
    """Every retained checkpoint read back in full: intact files, a consistent cut."""
    storage = CheckpointStorage(str(checkpoints))
    ids = storage.completed_ids()
    assert ids
    for n in ids:
        verification = verify_checkpoint(storage.location(n), n)
        assert verification.ok, verification.summary()
    return len(ids)


def killed_host(stdout: str) -> str:
    match = re.search(r"lost the host (\S+) of slot-1: ran", stdout)
    assert match, stdout
    return match.group(1)


def test_the_job_runs_across_hosts_and_survives_losing_one(cluster: Cluster, workdir: Path) -> None:
    stdout = cluster.run_demo(workdir, "--kill-command", f"{SCRIPT} kill-worker {{host}}")
    exact(workdir)
    lost = killed_host(stdout)
    history = CheckpointStorage(str(workdir / "ck")).read_history()
    [restart] = history.restarts
    [run] = history.runs
    # generation 1 ran on two hosts: each slot on a worker's own address, which is also the
    # address its data server advertised to the others (never localhost)
    first = restart.hosts
    assert sorted(first) == ["slot-0", "slot-1"]
    assert len(set(first.values())) == 2
    assert set(first.values()) <= set(cluster.workers)
    assert first["slot-1"] == lost
    assert f"slot-1: lost (on {lost})" in restart.cause
    assert restart.restored_from is not None and restart.restarted
    # the next generation restarted from that checkpoint on the hosts that remained
    second = run.hosts
    assert len(set(second.values())) == 2
    assert set(second.values()) <= set(cluster.workers) - {lost}
    assert run.outcome == "finished"
    assert "exact: 2,000,000 records published" in stdout
    verified(workdir / "ck")
    # the lost host is back for the next test
    assert cluster.script("start-worker", lost).returncode == 0


@pytest.mark.slow  # (a minute: in `make soak`)
def test_a_host_cut_off_the_network_is_declared_lost_and_the_job_goes_on_without_it(
    cluster: Cluster, workdir: Path
) -> None:
    """Its processes live on, unreachable: no connection closes, the heartbeats stop."""
    cut = f"{SCRIPT} cut-link {{host}}"
    try:
        stdout = cluster.run_demo(workdir, "--heartbeat-timeout", "5", "--kill-command", cut)
    finally:
        for worker in cluster.workers:
            cluster.script("heal-link", worker)
    exact(workdir)
    lost = killed_host(stdout)
    history = CheckpointStorage(str(workdir / "ck")).read_history()
    [restart] = history.restarts
    assert restart.cause == (
        f"slot-1: stopped answering (no heartbeat for 5 s, while running) (on {lost})"
    )
    assert lost not in history.runs[-1].hosts.values()
    verified(workdir / "ck")


@pytest.mark.slow  # (a minute each: in `make soak`; the policy and the resume are
# also tested without a cluster, in test_slots.py and test_resume.py)
def test_with_on_host_loss_wait_the_job_waits_for_the_lost_host(
    cluster: Cluster, workdir: Path
) -> None:
    # the host comes back 2 s after it was lost
    back = f"{SCRIPT} kill-worker {{host}} && (sleep 2; {SCRIPT} start-worker {{host}}) &"
    stdout = cluster.run_demo(workdir, "--on-host-loss", "wait", "--kill-command", back)
    exact(workdir)
    lost = killed_host(stdout)
    assert re.search(rf"waiting up to 120 s for .*host\(s\) {re.escape(lost)} to come back", stdout)
    assert "task slots free and every host back" in stdout
    [restart] = CheckpointStorage(str(workdir / "ck")).read_history().restarts
    assert restart.hosts["slot-1"] == lost
    verified(workdir / "ck")


@pytest.mark.slow  # (a minute each: in `make soak`; the policy and the resume are
# also tested without a cluster, in test_slots.py and test_resume.py)
def test_a_job_whose_driver_died_resumes_from_the_latest_checkpoint(
    cluster: Cluster, workdir: Path
) -> None:
    # the driver kills itself, and its process group with it (its JVM, as a lost machine),
    # on its first checkpoint: while its sources hold, so always with input left
    driver = subprocess.run(
        cluster.demo(workdir, "--kill-command", "/bin/kill -s KILL -- -$PPID"),
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,  # a process group of its own, which the command kills
    )
    assert driver.returncode == -signal.SIGKILL, driver.stdout + driver.stderr
    assert re.search(r"checkpoint \d+ complete", driver.stdout), driver.stdout
    storage = CheckpointStorage(str(workdir / "ck"))
    latest = max(storage.completed_ids())
    stdout = cluster.run_demo(workdir, "--no-kill", "--resume")
    exact(workdir)
    assert f"resumed from {storage.location(latest).url}" in stdout
    runs = CheckpointStorage(str(workdir / "ck")).read_history().runs
    assert [r.outcome for r in runs] == [None, "finished"]  # the first driver never ended it
    assert runs[1].restored_from == storage.location(latest).url
    verified(workdir / "ck")


def test_the_script_refuses_clearly_without_network_namespaces(tmp_path: Path) -> None:
    """As a user who may not make namespaces (``nobody``), ``up`` says why and changes nothing.
    ``nobody`` runs a copy of the script in a folder it can read, wherever the checkout lies
    (a clone in root's home directory, mode 0700, is out of its reach; so is pytest's tmp)."""
    script = SCRIPT
    if sys.platform.startswith("linux") and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is missing: cannot drop root to see the refusal")
        shared = Path(tempfile.mkdtemp(prefix="cutline-refuse-"))
        shared.chmod(0o755)
        (shared / "scripts").mkdir(mode=0o755)
        script = shared / "scripts" / "cluster.sh"
        shutil.copy2(SCRIPT, script)
        script.chmod(0o755)
        cluster_dir = shared / "cluster"
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(script), "up"]
    else:
        shared = None
        cluster_dir = tmp_path / "cluster"
        command = [str(script), "up"]
    env = {
        **os.environ,
        "CUTLINE_CLUSTER_NAME": "clrefuse",
        "CUTLINE_CLUSTER_DIR": str(cluster_dir),
    }
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "network namespaces are not available" in done.stderr
    if sys.platform.startswith("linux") and shutil.which("ip") is not None:
        assert "The test cluster needs root" in done.stderr
    assert not cluster_dir.exists()
    if shutil.which("ip") is not None:
        bridge = subprocess.run(["ip", "link", "show", "clrefuse-br"], capture_output=True)
        assert bridge.returncode != 0
