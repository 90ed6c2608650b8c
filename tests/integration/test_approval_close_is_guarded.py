"""Closing an approval is a guarded transition: a late or concurrent close never overwrites another outcome.

Two check_status calls applying the same decision, or an expiry racing a person's
answer, used to let the last writer win: `applied` became `void`, `approved` became
`expired`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pollwarden.core.vocabulary import ApprovalStatus
from pollwarden.store import open_store
from tests.integration.test_operator_decisions import escalate_and_ask, harness
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.anyio


async def test_an_applied_approval_is_never_voided_by_a_second_close(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "twice")
    async with open_store(h.db_path) as store:
        decided = await store.decide_approval(
            approval_id, approve=True, by="alice", at=h.clock.now(), method="tty"
        )
        assert decided is not None
        assert decided.status == ApprovalStatus.APPROVED
        first = await store.close_approval(
            approval_id, status=ApprovalStatus.APPLIED, at=h.clock.now(), note="ok"
        )
        assert first is not None
        late = await store.close_approval(
            approval_id, status=ApprovalStatus.VOID, at=h.clock.now(), note="the operation changed"
        )
        assert late is None
        after = await store.get_approval(approval_id)
    assert after is not None
    assert (after.status, after.note) == (ApprovalStatus.APPLIED, "ok")


async def test_an_expiry_close_never_overwrites_a_persons_approval(
    tmp_path: Path, fake: FakeProvider
) -> None:
    h = harness(tmp_path, fake)
    approval_id = await escalate_and_ask(h, "raced")
    async with open_store(h.db_path) as store:
        await store.decide_approval(approval_id, approve=True, by="alice", at=h.clock.now(), method="console")
        expired = await store.close_approval(
            approval_id,
            status=ApprovalStatus.EXPIRED,
            at=h.clock.now(),
            note="nobody decided in time",
            audit_kind="approval_expired",
        )
        assert expired is None
        after = await store.get_approval(approval_id)
    assert after is not None
    assert after.status == ApprovalStatus.APPROVED
