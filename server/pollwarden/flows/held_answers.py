"""Answers the database could not record yet (issue 29): held in memory, recorded when it returns.

A status request goes out only under a committed reservation. If the database
fails after the provider answered (a restart, a lock held past its timeout), the
answer is not lost and the request is never sent again: this process keeps the
answer (what `apply_answer` would write) and records it as soon as it can — on
a doubling schedule in the background, then every `MAX_RETRY_SECONDS` for as
long as this process runs (it is never dropped), and first thing in the next
`check_status` of that operation in this process. Until then the reservation's
lease stays in the database, so no other check sends for the operation; if the
lease expires first, another check may send, and the held answer is then
recorded as a late answer (audited, not applied), as `apply_answer` does.

The agent is told the truth: the request was sent, and its answer will be
recorded (`answer_held_message`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pollwarden.core.clock import Clock
from pollwarden.core.errors import StoreError
from pollwarden.core.records import OperationRecord
from pollwarden.core.untrusted import shown
from pollwarden.store import Store

log = logging.getLogger("pollwarden")

# The background schedule: first try after this, doubling up to the cap, then at the cap while the
# process lives; after this many tries (about ten minutes) the log says the answer is still held.
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 10.0
RETRY_ATTEMPTS = 64


@dataclass(frozen=True)
class HeldAnswer:
    """One provider answer waiting for the database: the arguments of `Store.apply_answer`."""

    operation_id: str
    owner: str
    changes: Mapping[str, object]
    at: float
    payload_extra: Mapping[str, object]


def answer_held_message(operation_id: str, problem: StoreError) -> str:
    """What the agent is told when an answer could not be recorded: that the request was sent."""
    cause = str(problem).split("; ")[0]  # the problem; not the store's "nothing was sent" advice
    return (
        f"the status request for {shown(operation_id)} was sent and the provider answered, but the "
        f"database could not record the answer ({cause}); this server holds the answer and records it "
        "when the database returns — it will not be sent again. Call check_status again shortly"
    )


def retry_delays() -> list[float]:
    """The background retry's waits, in order."""
    delays: list[float] = []
    delay = FIRST_RETRY_SECONDS
    for _ in range(RETRY_ATTEMPTS):
        delays.append(delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)
    return delays


class HeldAnswers:
    """This process's answers not recorded yet, by operation id (at most one each: one lease)."""

    def __init__(self) -> None:
        self._held: dict[str, HeldAnswer] = {}

    def __contains__(self, operation_id: str) -> bool:
        return operation_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def keep(self, answer: HeldAnswer) -> None:
        """Hold an answer the database refused."""
        self._held[answer.operation_id] = answer

    async def record(self, store: Store, operation_id: str) -> OperationRecord | None:
        """Record the held answer for the operation (None: none held). Raises StoreError, keeping it.

        Taken out before the write, so the background retry and a check never record it twice.
        """
        answer = self._held.pop(operation_id, None)
        if answer is None:
            return None
        try:
            updated, applied = await store.apply_answer(
                answer.operation_id,
                owner=answer.owner,
                changes=answer.changes,
                at=answer.at,
                payload_extra=answer.payload_extra,
            )
        except StoreError as exc:
            self._held.setdefault(operation_id, answer)
            raise StoreError(answer_held_message(operation_id, exc)) from exc
        log.info("held answer for %s recorded%s", operation_id, "" if applied else " (late: not applied)")
        return updated

    async def record_in_background(self, store: Store, clock: Clock, operation_id: str) -> None:
        """Try to record the operation's held answer: on the doubling schedule, then every
        `MAX_RETRY_SECONDS` until it is recorded (here or by a check) or the process ends; never dropped,
        so a database back after a long outage still gets the answer, and no request is sent for it again."""
        for tries, delay in enumerate(
            itertools.chain(retry_delays(), itertools.repeat(MAX_RETRY_SECONDS)), 1
        ):
            await clock.sleep(delay)
            if operation_id not in self._held:
                return  # recorded by a check meanwhile
            try:
                await self.record(store, operation_id)
                return
            except StoreError:
                if tries == RETRY_ATTEMPTS:
                    log.error(
                        "the answer for %s could not be recorded in %d tries; it stays held and is tried "
                        "again every %g s while this process runs",
                        operation_id,
                        RETRY_ATTEMPTS,
                        MAX_RETRY_SECONDS,
                    )
