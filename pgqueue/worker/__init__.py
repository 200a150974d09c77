"""The worker: claim tasks sized to free slots, run them, record outcomes, survive the database.

One worker process runs one asyncio loop with these services, each in a module of its own,
each a class given what it depends on, with its loop (``run``) apart from its step so that a
test can drive it one step at a time:

- the **claimer** (claimer.py) claims as many ready tasks as it has free slots, in one
  statement; it wakes on a NOTIFY from an enqueue, on a freed slot, or on a jittered poll
  (the fallback); with no NOTIFY to hear (behind a transaction pooler without a LISTEN URL,
  or with NOTIFY off), its polls adapt to the traffic instead (claimer.PollSchedule);
- the **runner** (runner.py) starts each claimed task on the executor and records its
  outcome: completions go to the completer, failures and cancellations are written at once;
- the **listener** (listener.py) holds a LISTEN connection and re-establishes it after any
  disconnect (then wakes the claimer, since notifications sent meanwhile are gone);
  it LISTENs on the database URL, or on ``listen_url`` behind a transaction pooler, and is
  not there at all behind one without it: then the **cancel poll** (cancels.py) reads the
  running tasks' cancel flags twice a second;
- the **completer** (completer.py) writes completions in batches (one statement for all
  that finished meanwhile), each fenced by its lease token;
- the **heartbeat** (heartbeat.py) renews every lease the worker holds, learns of
  cancellation requests and lost leases, and tells the handlers through their context;
- the **scheduler** (scheduler.py) enqueues the registry's periodic schedules' due ticks;
- **overruns** (overruns.py) counts the sync handlers running on past their timeout (their
  tasks held until the threads return) and asks the worker to recycle past
  ``max_overrunning``;
- the **watchdog** (watchdog.py), a thread, notices a blocked event loop and names the async
  handler that held it;
- **maintenance** (maintenance.py: expired-lease sweep, retention pruning, promotion,
  ANALYZE), one runner per database at a time;
- **metrics** (metrics.py): Prometheus metrics and /healthz, with a metrics port only.

:class:`Worker` (service.py) builds them, runs them and stops them. Database errors never
crash a loop: every error of every statement is logged, counted and retried with a capped
backoff (database.py, database_errors.py), and the lease fence decides afterwards whose
outcome counts; only a bug of the worker's own stops it (exit code 1), to be restarted.
"""

from __future__ import annotations

from pgqueue.worker.config import WorkerConfig
from pgqueue.worker.maintenance import MaintenanceConfig
from pgqueue.worker.service import Worker

__all__ = ["MaintenanceConfig", "Worker", "WorkerConfig"]
