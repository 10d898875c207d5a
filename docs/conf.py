"""Sphinx configuration of cutline's documentation: ``make docs`` builds it into
``docs/_build/html`` with warnings as errors (a broken cross-reference fails the build).

The pages are MyST Markdown; the API reference is autodoc over the docstrings (reST fields,
``:param x:``). Nothing is executed: the examples run in the tests
(``tests/tools/test_docs_examples.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import cutline  # noqa: E402

project = "cutline"
author = "the cutline developers"
copyright = "the cutline developers"
release = version = cutline.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
html_theme = "furo"
html_title = f"cutline {release}"
html_static_path: list[str] = []

# headings get anchors down to ####, so that a page links to [a section](#its-title)
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True}

nitpicky = True
# No network here, so no intersphinx: the types of the standard library and of the libraries
# cutline works with (pyarrow, PySpark, ...) that appear in signatures cannot be linked.
nitpick_ignore_regex = [
    (r"py:class", r"(collections\.abc|datetime|os|pathlib|re)\.\w+"),  # the standard library's
    (r"py:class", r"(numpy|pyarrow|pyspark)(\.\w+)*\.\w+"),  # ndarray, Schema, SparkSession, ...
]

# ----------------------------------------------------------------- public names

# The public classes live in modules of their own (cutline.runtime..., cutline.api...), and
# are documented under the names a user imports them by (cutline.StreamEnvironment,
# cutline.connectors.Source). A reference to the module a class lives in (as a signature's
# type annotations make them) is resolved to its public name.
PUBLIC_PACKAGES = (
    "cutline",
    "cutline.connectors",
    "cutline.testing",
    "cutline.protocol",
    "cutline.sim",
)


def public_names() -> dict[str, str]:
    """``{where an object is defined: the name it is documented under}``."""
    names: dict[str, str] = {}
    for package_name in PUBLIC_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ImportError:  # (cutline.testing, until it is there)
            continue
        for name in getattr(package, "__all__", ()):
            obj = getattr(package, name, None)
            qualname = getattr(obj, "__qualname__", None)
            module = getattr(obj, "__module__", None)
            if qualname and module and f"{module}.{qualname}" not in names:
                names[f"{module}.{qualname}"] = f"{package_name}.{name}"
    return names


def find(dotted: str) -> Any:
    """The object ``dotted`` names (a module's attribute, or a member of a class), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def names_for(target: str, names: dict[str, str]) -> list[str]:
    """The names ``target`` may be documented under: itself; the public name of the class it
    is, or is a member of; the name a public package exports the object under (a constant)."""
    found = [target]
    owner, _, member = target.rpartition(".")
    for whole, suffix in ((target, ""), (owner, f".{member}")):
        if whole in names:
            found.append(names[whole] + suffix)
    obj = find(target)
    if obj is not None:
        qualname = getattr(obj, "__qualname__", None)
        module = getattr(obj, "__module__", None)
        if qualname and module:
            found.append(f"{module}.{qualname}")
            found += names_for(f"{module}.{qualname}", names)[1:] if found[-1] != target else []
        for package_name in PUBLIC_PACKAGES:
            package = sys.modules.get(package_name)
            for name in getattr(package, "__all__", ()):
                if name == member and getattr(package, name, None) is obj:
                    found.append(f"{package_name}.{name}")
    return found


def candidates(node: Any) -> list[str]:
    """Where a reference's target may be documented: as written, in the module and the class
    the reference is made from (as they are documented, and where they are defined), in the
    bases of that class (a member it inherits is documented on the base)."""
    target = node["reftarget"].lstrip("~.")
    module, cls = node.get("py:module"), node.get("py:class")
    signature = node.parent
    while signature is not None and "fullname" not in signature.attributes:
        signature = signature.parent  # (a type in a signature: the object it describes)
    if signature is not None and not cls:
        cls = signature["fullname"].split(".")[0] or None
    found = [target]
    if module:
        context = find(f"{module}.{cls}") if cls else None
        modules = [module, getattr(context, "__module__", module)]
        for where in dict.fromkeys(modules):
            found.append(f"{where}.{target}")
            if cls:
                found.append(f"{where}.{cls}.{target}")
        for base in getattr(context, "__mro__", ())[1:]:
            found.append(f"{base.__module__}.{base.__qualname__}.{target}")
    return found


def resolve_public_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    names = app.config._public_names
    documented = domain.objects
    tried = candidates(node)
    for candidate in tried:
        for name in names_for(candidate, names):
            if name in documented:
                return domain.resolve_xref(
                    env, node["refdoc"], app.builder, node["reftype"], name, node, contnode
                )
    # (an unqualified name in a docstring: the one documented object of that name)
    if "." not in tried[0]:
        matches = [
            name
            for name, entry in documented.items()
            if name.rpartition(".")[2] == tried[0] and not entry.aliased
        ]
        if len(matches) == 1:
            return domain.resolve_xref(
                env, node["refdoc"], app.builder, node["reftype"], matches[0], node, contnode
            )
    # A type in a signature that is the runtime's own, not documented one by one (the state
    # backend an operator is opened with, the event clock): shown, not linked. Every
    # reference a docstring makes (``refexplicit`` is set on those) must resolve.
    if "refexplicit" not in node:
        found = (find(candidate) for candidate in tried)
        if any(getattr(obj, "__module__", "").startswith("cutline.") for obj in found):
            return contnode
    return None


def parseable_defaults(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, ret: str | None
) -> tuple[str | None, str | None]:
    """A dataclass field's default made by a factory shows as ``<factory>``, which is no
    Python: Sphinx would then split the signature at every comma (``dict[str, int]`` into two
    types). It is shown as ``...``."""
    if signature is not None:
        signature = signature.replace("<factory>", "...")
    return signature, ret


class CliHelp(SphinxDirective):
    """``{cli-help} checkpoints list``: what ``cutline checkpoints list --help`` prints, as
    it prints it (so that the page never drifts from the command)."""

    optional_arguments = 4

    def run(self) -> list[nodes.Node]:
        from click.testing import CliRunner

        from cutline.cli import main

        out = CliRunner().invoke(
            main, [*self.arguments, "--help"], prog_name="cutline", terminal_width=92
        )
        if out.exit_code != 0:
            raise self.error(f"cutline {' '.join(self.arguments)} --help: {out.output}")
        text = out.output.rstrip("\n")
        return [nodes.literal_block(text, text, language="text")]


class PackageModules(SphinxDirective):
    """``{package-modules} cutline.runtime.checkpoint``: the package's docstring, then each of
    its modules' (found when the page is built, so that a module added, split or removed needs
    no edit here); ``:recursive:`` takes the modules of its subpackages too."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {"recursive": directives.flag}

    def run(self) -> list[nodes.Node]:
        package = importlib.import_module(self.arguments[0])
        lines = [f".. automodule:: {package.__name__}", "   :no-members:", ""]
        walk = pkgutil.walk_packages if "recursive" in self.options else pkgutil.iter_modules
        for info in sorted(walk(package.__path__, package.__name__ + "."), key=lambda m: m.name):
            if info.ispkg and "recursive" not in self.options:
                continue  # (a page of its own)
            lines += [f".. rubric:: {info.name}", "", f".. automodule:: {info.name}"]
            lines += ["   :no-members:", ""]
        # (the pages are Markdown, whose parser reads a directive's text: reST is fenced)
        return self.parse_text_to_nodes("\n".join(["```{eval-rst}", *lines, "```"]))


class PublicApi(SphinxDirective):
    """``{public-api} cutline.protocol``: every name of the package's ``__all__``, in its
    order, documented where the package exports it."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        package = importlib.import_module(self.arguments[0])
        lines = [f".. currentmodule:: {package.__name__}", ""]
        for name in package.__all__:
            obj = getattr(package, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                lines.append(f".. autoexception:: {name}")
            elif isinstance(obj, type):
                lines.append(f".. autoclass:: {name}")
            elif callable(obj):
                lines.append(f".. autofunction:: {name}")
            else:
                lines.append(f".. autodata:: {name}")
                lines.append("   :annotation:")
        return self.parse_text_to_nodes("\n".join(["```{eval-rst}", *lines, "```"]))


def plain_in_internals(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """In the pages of the internals' packages (module docstrings), a name of a class or
    function of the runtime that is not documented one by one is shown as code, unlinked."""
    if node.get("refdomain") == "py" and node["refdoc"].startswith("internals/packages/"):
        return contnode
    return None


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("cli-help", CliHelp)
    app.add_directive("package-modules", PackageModules)
    app.add_directive("public-api", PublicApi)
    app.connect("missing-reference", plain_in_internals, priority=900)
    app.config._public_names = public_names()
    app.connect("missing-reference", resolve_public_name)
    app.connect("autodoc-process-signature", parseable_defaults)
    return {"parallel_read_safe": True}
