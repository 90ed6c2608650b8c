"""A PostgreSQL process's turn at a provider's pace row (`store.postgres.pace_turn`): why a wait ends.

Real anyio tasks; the only wait is the bound under test (1 s).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from pollwarden.store.postgres.pace_turn import PaceTurn, PaceTurnBusy, PaceTurnStuck

pytestmark = pytest.mark.anyio

BOUND = 1.0  # long enough that a loaded machine never times a wait out before its turn goes by


async def _hold(turn: PaceTurn, release: anyio.Event, fail: bool = False) -> None:
    try:
        async with turn.take(BOUND * 10):
            await release.wait()
            if fail:
                raise RuntimeError("the transaction failed")
    except RuntimeError:
        pass


async def _until_waiting(turn: PaceTurn, count: int) -> None:
    while turn.waiting < count:
        await anyio.lowlevel.checkpoint()


async def test_a_check_that_waited_while_turns_went_by_is_told_the_turn_is_busy_with_how_many_wait() -> None:
    turn = PaceTurn()
    first, second = anyio.Event(), anyio.Event()
    outcome: list[BaseException] = []

    async def check() -> None:
        try:
            async with turn.take(BOUND):
                pass
        except (PaceTurnBusy, PaceTurnStuck) as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, turn, first)
        await anyio.lowlevel.checkpoint()
        tg.start_soon(_hold, turn, second)  # next in line, then holds the turn past the bound
        await _until_waiting(turn, 1)
        tg.start_soon(check)
        await _until_waiting(turn, 2)
        first.set()  # one turn goes by while the check waits
        while not outcome:
            await anyio.lowlevel.checkpoint()
        second.set()
    [busy] = outcome
    assert isinstance(busy, PaceTurnBusy)
    assert (busy.served, busy.waiting, busy.waited) == (1, 1, BOUND)
    assert turn.served == 2
    assert turn.waiting == 0


async def test_a_check_that_waited_while_no_turn_went_by_is_told_the_turn_is_stuck() -> None:
    turn = PaceTurn()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, turn, release)
        await anyio.lowlevel.checkpoint()
        with pytest.raises(PaceTurnStuck):
            async with turn.take(BOUND):
                pass
        release.set()
    async with turn.take(BOUND):  # free again
        assert turn.waiting == 0


async def test_a_turn_whose_transaction_failed_does_not_count_as_gone_by() -> None:
    turn = PaceTurn()
    failing, holding = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hold, turn, failing, True)
        await anyio.lowlevel.checkpoint()
        tg.start_soon(_hold, turn, holding)
        await _until_waiting(turn, 1)
        failing.set()  # the holder's transaction fails (a lock_timeout): no turn went by
        with pytest.raises(PaceTurnStuck):
            async with turn.take(BOUND):
                pass
        holding.set()
    assert turn.served == 1
