"""A deterministic, seeded discrete-event simulator over the protocol layer.

* :mod:`cutline.sim.scenario` — the topology and events file format (the simulator page's
  "Topology file" and "Events file");
* :mod:`cutline.sim.simulator` — the simulator and the token-bank process model;
* :mod:`cutline.sim.checker` — the independent consistency checker;
* :mod:`cutline.sim.output` — snapshots as text (the simulator page's "Snapshot output") or JSON;
* :mod:`cutline.sim.diagram` — the space-time diagram;
* :mod:`cutline.sim.generate` — random strongly connected scenarios.
"""

from cutline.sim.checker import Verdict, Violation, check_run, simulate_and_check
from cutline.sim.log import EventKind, LogEvent, Payment, RecordedSnapshot, SimRun
from cutline.sim.scenario import (
    Initiate,
    Scenario,
    ScenarioError,
    Send,
    Tick,
    Topology,
    load_scenario,
    scenario_from_text,
)
from cutline.sim.simulator import SimConfig, simulate

__all__ = [
    "EventKind",
    "Initiate",
    "LogEvent",
    "Payment",
    "RecordedSnapshot",
    "Scenario",
    "ScenarioError",
    "Send",
    "SimConfig",
    "SimRun",
    "Tick",
    "Topology",
    "Verdict",
    "Violation",
    "check_run",
    "load_scenario",
    "scenario_from_text",
    "simulate",
    "simulate_and_check",
]
