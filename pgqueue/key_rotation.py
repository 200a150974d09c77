"""Where the fair claim's turns got to, per queue and priority, so that the next claim gives
the next keys their turn (see task_claim_keyed in sql/claiming.sql).

The claim walks the keys with waiting tasks in key order (byte order: the column's collation
is "C", as Python compares str), from the one after the last key served, round to the end,
where the tasks without a key take their turn ('' here), then from the first key on. The next
claim starts after the key of the last task in the batch's fill order (the batch is filled in
rounds, so that is a key served most, the last of those in the walk's order): the greatest
such key at or before the old start if the walk went round, else the greatest after it.

Each worker keeps its own rotation (pgqueue.claim, one per worker_id, in this process):
claims are serialized by the limits lock, and every worker's rotation goes round all the
keys, so each key gets a turn from each worker in turn.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

from pgqueue.models import ClaimedTask
from pgqueue.queries.claiming import KeyRotation as Rotation


class KeyRotation:
    """The last key served per (queue, priority); pure bookkeeping, driven by the claimer."""

    def __init__(self) -> None:
        self._after: dict[tuple[str, int], str] = {}

    def current(self) -> Rotation:
        return dict(self._after)

    def claimed(self, tasks: Iterable[ClaimedTask]) -> None:
        """Move each lane's start past the keys a claim served."""
        served: dict[tuple[str, int], list[str]] = {}
        for task in tasks:
            served.setdefault((task.queue, int(task.priority)), []).append(
                task.concurrency_key or ""
            )
        for lane, keys in served.items():
            # The batch was filled in rounds (each key's first task, then each one's second,
            # ...): a key served n times was in rounds 1 to n, so the last task in fill order
            # is of a key served most, the last of those in the rotation's order.
            counts = Counter(keys)
            most = max(counts.values())
            last_round = [key for key, n in counts.items() if n == most]
            after = self._after.get(lane, "")
            went_round = [key for key in last_round if key <= after]
            self._after[lane] = max(went_round) if went_round else max(last_round)


# pgqueue.claim's rotations, one per worker_id, the least recently used forgotten past this
# many (a forgotten one starts again from the first key: fair still, over time).
_REMEMBERED = 1024
_rotations: OrderedDict[str, KeyRotation] = OrderedDict()


def rotation_of(worker_id: str) -> KeyRotation:
    """The rotation of a caller of pgqueue.claim that names itself ``worker_id``."""
    rotation = _rotations.pop(worker_id, None) or KeyRotation()
    _rotations[worker_id] = rotation
    while len(_rotations) > _REMEMBERED:
        _rotations.popitem(last=False)
    return rotation
