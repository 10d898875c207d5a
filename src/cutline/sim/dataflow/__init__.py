"""The dataflow model of barrier checkpoints: a seeded model of a small dataflow that drives the
real barrier handlers and the termination detector of loops through random schedules, and an
independent checker of what they did.

* :mod:`cutline.sim.dataflow.graph` — the graphs, their records, barriers and ends of input;
* :mod:`cutline.sim.dataflow.config` — what a run is given: the mode, its handlers, the schedule;
* :mod:`cutline.sim.dataflow.state` — what a run is made of (channels, subtasks, snapshots) and
  what it leaves (:class:`DataflowRun`);
* :mod:`cutline.sim.dataflow.checkpoints` — the coordinator's checkpoints and the handlers'
  actions carried out;
* :mod:`cutline.sim.dataflow.model` — one run of a graph under a schedule (:func:`run_dataflow`);
* :mod:`cutline.sim.dataflow.check` — what a run must show: every checkpoint a consistent cut,
  every restore replaying to the failure-free result (:func:`check_dataflow_run`).
"""

from cutline.sim.dataflow.check import (
    check_checkpoints,
    check_dataflow_run,
    check_replay,
    compare_states,
    reference_states,
    replay,
    restore_point,
)
from cutline.sim.dataflow.config import (
    MODES,
    DataflowConfig,
    Handler,
    HandlerFactory,
    Mode,
    default_handler,
)
from cutline.sim.dataflow.graph import (
    END,
    BarrierItem,
    ChannelId,
    DataflowGraph,
    EndItem,
    Item,
    Record,
    dag_topology,
    loop_topology,
)
from cutline.sim.dataflow.model import DataflowModel, run_dataflow
from cutline.sim.dataflow.state import DataflowRun, TaskSnapshot

__all__ = [
    "END",
    "MODES",
    "BarrierItem",
    "ChannelId",
    "DataflowConfig",
    "DataflowGraph",
    "DataflowModel",
    "DataflowRun",
    "EndItem",
    "Handler",
    "HandlerFactory",
    "Item",
    "Mode",
    "Record",
    "TaskSnapshot",
    "check_checkpoints",
    "check_dataflow_run",
    "check_replay",
    "compare_states",
    "dag_topology",
    "default_handler",
    "loop_topology",
    "reference_states",
    "replay",
    "restore_point",
    "run_dataflow",
]
