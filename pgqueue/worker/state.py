"""The bookkeeping the worker's services share: who holds its slots, and its stop request.

The services get these objects passed in rather than reaching into one another: the runner
fills ``running``, the completer drains ``pending``, the heartbeat renews the leases of both,
the claimer sizes its claims to what is left, and the worker drains them at shutdown. Each
service keeps its own reference to the same dict and list (they are never rebound), so the
per-task path reads an attribute of its own, as it did when all of this was one class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from pgqueue.executor import TaskContext
from pgqueue.models import ClaimedTask


@dataclasses.dataclass
class Running:
    task: ClaimedTask
    ctx: TaskContext
    started: float
    job: asyncio.Task[None] | None = None
    released: bool = False
    recording: bool = False  # the outcome is being written: the row may leave 'running'


@dataclasses.dataclass
class PendingCompletion:
    """A completion waiting for the batched write; its lease is held (and renewed) until the
    write is done."""

    task: ClaimedTask
    result_json: str | None
    duration: float


class Slots:
    """The worker's slots, and the claimer's wake-ups.

    Both wake-ups are set from outside the claimer (a NOTIFY, a freed slot, a stop), so they
    live here with the slots rather than inside it.
    """

    def __init__(self) -> None:
        self.running: dict[uuid.UUID, Running] = {}
        self.pending: list[PendingCompletion] = []
        self.wake = asyncio.Event()  # look for tasks now
        self.slot_freed = asyncio.Event()
        # Whether the claimer saw limits or keyed tasks at its last look (it then probes at
        # every claim).
        self.limited = False

    def changed(self) -> None:
        """A slot of ours freed: the claimer may claim again, and with limits in play the
        freed slot may be a limit's, which no notification announces: look at once."""
        self.slot_freed.set()
        if self.limited:
            self.wake.set()


class StopRequest:
    """Whether the worker is stopping, and whether it must stop now. The flags are what the
    services test on their paths; the events are what waits wake on."""

    def __init__(self) -> None:
        self.stopping = False
        self.force = False
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
