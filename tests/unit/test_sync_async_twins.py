"""Sync and async come from one definition: ``pgqueue.aio`` has every operation of
``pgqueue.operations``, bound from the same builder, with the same signature and docs."""

from __future__ import annotations

import inspect

import pgqueue
import pgqueue.aio
from pgqueue import operations


def _operations() -> dict[str, object]:
    return {n: v for n, v in vars(operations).items() if callable(getattr(v, "aio", None))}


def test_every_operation_has_its_async_twin_under_the_same_name() -> None:
    ops = _operations()
    assert len(ops) >= 30  # the finder finds them: a vacuous pass is not possible
    missing = [n for n, op in ops.items() if getattr(pgqueue.aio, n, None) is not op.aio]  # type: ignore[attr-defined]
    assert missing == []


def test_twins_share_signature_and_docs() -> None:
    for name, op in _operations().items():
        twin = getattr(pgqueue.aio, name)
        assert inspect.iscoroutinefunction(twin), name
        assert not inspect.iscoroutinefunction(op), name
        assert inspect.signature(twin) == inspect.signature(op), name
        assert twin.__doc__ == op.__doc__ and op.__doc__, name


def test_the_public_sync_names_are_the_operations() -> None:
    ops = _operations()
    exported = {n for n in pgqueue.__all__ if n in ops}
    assert exported and all(getattr(pgqueue, n) is ops[n] for n in exported)
