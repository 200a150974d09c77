"""Several worker processes under one command (``pgqueue worker --processes N``).

Each child is a complete worker (its own event loop, connections and handler threads), so
the GIL does not cap a multi-core machine and one child's crash (a segfault, ``os._exit``, an
OOM kill) does not take the others down: the supervisor restarts it, with a backoff if it
keeps dying. SIGTERM/SIGINT are passed on to every child (graceful); a second signal is
passed on too, which makes the children stop at once.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from pgqueue.log import event

RESTART_BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0


class Supervisor:
    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str] | None = None,
        slot_args: Callable[[int], Sequence[str]] | None = None,
    ) -> None:
        """``slot_args(slot)``: arguments added to the command of the child in that slot (and
        of its replacements), such as a metrics port of its own."""
        self.command = list(command)
        self.slot_args = slot_args
        self.env = dict(env) if env is not None else None
        self.processes = processes
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started_at: dict[int, float] = {}
        self.backoff: dict[int, float] = {}
        self.restart_at: dict[int, float] = {}
        self.signals = 0

    def _spawn(self, slot: int) -> None:
        extra = list(self.slot_args(slot)) if self.slot_args else []
        proc = subprocess.Popen([*self.command, *extra], env=self.env)
        self.children[slot] = proc
        self.started_at[slot] = time.monotonic()
        event("worker.process_started", slot=slot, pid=proc.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if self.signals == 1 else signal.SIGINT)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for slot in range(self.processes):
            self._spawn(slot)
        while True:
            if self.signals:
                for proc in self.children.values():
                    proc.wait()
                return 0
            now = time.monotonic()
            for slot, proc in list(self.children.items()):
                code = proc.poll()
                if code is None or slot in self.restart_at:
                    continue
                lived = now - self.started_at[slot]
                delay = (
                    0.5
                    if lived >= STABLE_AFTER
                    else min(self.backoff.get(slot, 0.25) * 2, RESTART_BACKOFF_MAX)
                )
                self.backoff[slot] = delay
                self.restart_at[slot] = now + delay
                event(
                    "worker.process_exited",
                    logging.WARNING,
                    slot=slot,
                    pid=proc.pid,
                    exit_code=code,
                    restart_in_s=round(delay, 2),
                )
            for slot, when in list(self.restart_at.items()):
                if now >= when and not self.signals:
                    del self.restart_at[slot]
                    self._spawn(slot)
            time.sleep(0.1)
