"""Run every slot of a job as a thread of this process: for the runtime's own tests, and for
debugging a job without Spark. Jobs run on Spark (:mod:`cutline.spark`); this launcher has the
same contract."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cutline.runtime.task.launch import SlotSetup
from cutline.runtime.task.slot import run_slot


class ThreadJob:
    def __init__(self, setup: SlotSetup) -> None:
        n = setup.plan.parallelism
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self.results: list[dict[str, Any]] = []
        self._threads = [
            threading.Thread(target=self._run, args=(setup, i), daemon=True, name=f"slot-{i}")
            for i in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, setup: SlotSetup, slot: int) -> None:
        try:
            result = run_slot(setup, slot, "127.0.0.1")
            with self._lock:
                self.results.append(result)
        except BaseException as exc:
            with self._lock:
                self._errors.append(f"slot {slot}: {type(exc).__name__}: {exc}")

    def error(self) -> str | None:
        with self._lock:
            return self._errors[0] if self._errors else None

    def cancel(self) -> None:
        pass  # the driver closes the control server: every slot stops

    def wait(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def detach(self) -> None:
        self.wait(60.0)  # threads of this process: none outlives the job


class ThreadLauncher:
    def launch(self, setup: SlotSetup) -> ThreadJob:
        return ThreadJob(setup)

    def driver_host(self) -> str:
        return "127.0.0.1"

    def wait_for_slots(
        self, needed: int, hosts: frozenset[str], timeout: float, say: Callable[[str], None]
    ) -> str | None:
        return None  # a thread per slot, on this one host
