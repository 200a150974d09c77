"""The waiter hub's Coalescer (pgqueue/api/waiters.py): the same read of many waits that
arrive together is one statement, each wait getting its own part of the answer."""

from __future__ import annotations

import asyncio

import pytest

from pgqueue.api.waiters import Coalescer


def test_items_submitted_together_are_one_batch_and_each_gets_its_part() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> dict[int, int]:
        batches.append(items)
        await asyncio.sleep(0.01)
        return {i: i * 10 for i in items}

    async def scenario() -> list[int]:
        coalescer = Coalescer(run, lambda result, item: result[item])
        first = await asyncio.gather(*(coalescer.submit(i) for i in range(100)))
        later = await coalescer.submit(7)
        return [*first, later]

    assert asyncio.run(scenario()) == [i * 10 for i in range(100)] + [70]
    assert batches == [list(range(100)), [7]]


def test_items_submitted_while_a_batch_runs_go_in_the_next_one() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> None:
        batches.append(items)
        await asyncio.sleep(0.05)

    async def scenario() -> None:
        coalescer = Coalescer(run, lambda _result, item: item)
        first = asyncio.ensure_future(coalescer.submit(0))
        await asyncio.sleep(0.01)  # the first batch is running
        assert await asyncio.gather(first, *(coalescer.submit(i) for i in (1, 2))) == [0, 1, 2]

    asyncio.run(scenario())
    assert batches == [[0], [1, 2]]


def test_a_failed_batch_is_each_items_error_and_the_next_batch_still_runs() -> None:
    calls = 0

    async def run(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database down")
        return items

    async def scenario() -> None:
        coalescer = Coalescer(run, lambda _result, item: item)
        results = await asyncio.gather(
            coalescer.submit(1), coalescer.submit(2), return_exceptions=True
        )
        assert [str(r) for r in results] == ["database down"] * 2
        assert await coalescer.submit(3) == 3

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_batch_to_the_others() -> None:
    async def run(items: list[int]) -> list[int]:
        await asyncio.sleep(0.05)
        return items

    async def scenario() -> None:
        coalescer = Coalescer(run, lambda _result, item: item)
        gone = asyncio.ensure_future(coalescer.submit(1))
        kept = asyncio.ensure_future(coalescer.submit(2))
        await asyncio.sleep(0.01)
        gone.cancel()
        assert await kept == 2
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(scenario())
