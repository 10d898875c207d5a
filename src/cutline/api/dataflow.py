"""The graph of a job being built (:class:`Dataflow`): its operators, their ids, and what
``execute()`` needs to know of them. Every operator enters it through :meth:`Dataflow._add`
(see :mod:`cutline.api.streams` for the ids)."""

from __future__ import annotations

from typing import Any

import fsspec

from cutline.api.identity import lambda_text, operator_id
from cutline.api.settings import Settings
from cutline.runtime.graph import Edge, JobGraph, Operator
from cutline.runtime.operators import ON_ERROR, OnError


class Dataflow:
    """The graph of a job being built: its operators and their ids, and what ``execute()``
    needs to know of them (each operator's ``on_error``, the sources' rate limits, the
    directories of the file sinks, the collect sinks)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.graph = JobGraph()
        self._on_error: dict[str, OnError] = {}
        self._rate_limits: dict[str, float] = {}
        self._outputs: dict[str, str] = {}
        """File sink uid -> its directory."""
        self._collect: dict[str, str] = {}
        """Collect sink name -> its uid."""

    def _add(
        self,
        label: str,
        logic: Any,
        inputs: list[Edge],
        name: str | None = None,
        on_error: str = "fail",
        reads: str = "",
    ) -> Operator:
        """The one way an operator enters the graph: named ``name`` (its id and what messages
        call it) or, unnamed, called ``label`` with the id :func:`operator_id` gives it (from
        ``reads`` for a source, and the lambda of a logic whose function, ``fn``, is one)."""
        shown = label if name is None else name
        checked = self._check_on_error(shown, on_error)
        detail = reads or lambda_text(getattr(logic, "fn", None))
        uid = operator_id(label, inputs, detail) if name is None else name
        taken = self.graph.operators.get(uid)
        if taken is not None and name is not None:
            raise ValueError(
                f"name={name!r}: another operator ({taken.name}) has this name already; every "
                "operator's name must be its own (it is its id in checkpoints)"
            )
        if taken is not None:
            raise ValueError(
                f"{label}: the job has this operator already ({taken.name}: the same kind and "
                f"function, reading the same input), and both would have the id {uid!r}: give "
                "them name=... (each its own: the operator's stable id in checkpoints)"
            )
        operator = self.graph.add(Operator(uid, shown, logic, inputs))
        self._on_error[uid] = checked
        return operator

    def _check_on_error(self, name: str, on_error: str) -> OnError:
        """``on_error`` of the operator ``name``, checked."""
        for known in ON_ERROR:
            if on_error == known:
                if known == "dead_letter" and self.settings.dead_letter_dir is None:
                    raise ValueError(
                        f"{name}: on_error='dead_letter' needs a dead-letter directory: "
                        "StreamEnvironment(dead_letter_dir=...)"
                    )
                return known
        raise ValueError(f"{name}: on_error must be 'fail' or 'dead_letter', not {on_error!r}")

    def _location(self, directory: str) -> tuple[str, str]:
        """(protocol, path) of ``directory``: equal for two spellings of one place."""
        options = dict(self.settings.storage_options or {})
        fs, root = fsspec.core.url_to_fs(directory, **options)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return protocol, root.rstrip("/") or "/"

    def _check_output(self, directory: str, what: str) -> None:
        place = self._location(directory)
        if any(self._location(d) == place for d in self._outputs.values()):
            raise ValueError(f"{what}: two sinks write to {directory}; give each its own directory")
