"""What users read (every command's ``--help``, and the docstrings of the public modules:
the protocol as a library, the simulator) cites only what they have: the README's sections,
never the project's internal specification (``SEMANTICS``, ``shared/``)."""

from __future__ import annotations

import importlib
import pkgutil

import click
import pytest
from click.testing import CliRunner

import cutline.protocol
import cutline.sim
from cutline.cli import main

INTERNAL = ("SEMANTICS", "§", "shared/spec")


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


@pytest.mark.parametrize("path", commands(main), ids=lambda p: " ".join(p) or "cutline")
def test_no_help_cites_the_internal_specification(path: tuple[str, ...]) -> None:
    out = CliRunner().invoke(main, [*path, "--help"])
    assert out.exit_code == 0, out.output
    assert not [word for word in INTERNAL if word in out.output], out.output


def test_sim_help_gives_the_snapshot_format_and_where_the_readme_has_it() -> None:
    out = CliRunner().invoke(main, ["sim", "--help"]).output
    text = " ".join(out.split())
    assert 'simulator page\'s "Snapshot output" section' in text
    assert '"ID TOKENS" for every process' in text and '"SRC DST token(K)"' in text


def public_modules() -> list[str]:
    names = []
    for package in (cutline.protocol, cutline.sim):
        names.append(package.__name__)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", public_modules())
def test_no_public_docstring_cites_the_internal_specification(name: str) -> None:
    module = importlib.import_module(name)
    texts = [module.__doc__ or ""]
    texts += [
        member.__doc__ or ""
        for member_name, member in vars(module).items()
        if not member_name.startswith("_") and getattr(member, "__module__", None) == name
    ]
    for text in texts:
        assert not [word for word in INTERNAL if word in text], text
