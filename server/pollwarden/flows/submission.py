"""Submitting a new job: sent at most once per call, never a second job.

Only the I/O: claim the submission lease, send, and write what the pure
decisions (`pollwarden.rules.submit_answer`) made of it, under that lease. Plain
functions over the controller, which owns the store, the HTTP client, the
clock and the random source; start_operation records the operation and then
calls `submit`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pollwarden.core.records import OperationRecord
from pollwarden.rules.submit_answer import SubmitOutcome, interpret_submit_answer, submission_verdict
from pollwarden.store import new_lease_owner
from pollwarden_providers.table import ProviderTable

if TYPE_CHECKING:
    from pollwarden.flows.controller import Controller


async def submit(controller: Controller, record: OperationRecord, table: ProviderTable) -> OperationRecord:
    """Send the submission at most once per call, and never create a second job.

    The record, its fingerprint and its idempotency key are on disk before
    anything is sent. The submit request goes out under a lease that only a
    recorded outcome clears, so a lease found without an outcome means a call
    stopped after (perhaps) sending: with an idempotency key the request is
    resent with the same key (the provider answers with the same job);
    without one the operation stops as `delivery_ambiguous` and is never resent.
    """
    now = controller.clock.now()
    start = submission_verdict(record, table, now=now)
    if start is None:
        return record  # another call is sending it, or a retry is not yet allowed
    if isinstance(start, SubmitOutcome):
        # Nothing is in flight (decided above): an interrupted call's stale lease is cleared too.
        return await _write(controller, record, start, owner=None)
    owner = new_lease_owner()
    claimed = await controller.store.claim_submission(
        record.operation_id,
        owner=owner,
        now=now,
        lease_seconds=controller.lease_seconds,
        allow_stale=start.allow_stale,
        note=start.note,
    )
    if claimed is None:
        return await controller.load(record.operation_id)
    assert claimed.submit_payload_json is not None
    payload = json.loads(claimed.submit_payload_json)
    answer = await controller.http.submit(table, payload, claimed.idempotency_key)
    outcome = interpret_submit_answer(claimed, table, answer, rng=controller.rng)
    return await _write(controller, claimed, outcome, owner=owner)


async def _write(
    controller: Controller, record: OperationRecord, outcome: SubmitOutcome, *, owner: str | None
) -> OperationRecord:
    """Write one decided outcome; with `owner`, also release the lease taken to send it."""
    updated = await controller.store.finish_submission(
        record.operation_id,
        owner=owner,
        changes=outcome.changes,
        kind=outcome.kind,
        at=outcome.at,
        note=outcome.note,
        payload_extra={"rejected_hints": [h.as_record() for h in outcome.rejected_hints]},
    )
    return updated or await controller.load(record.operation_id)
