"""An operator names an HTTP principal's operation as its agent does, or with its owner (issue 29).

`pollwarden audit show` (and export) and the console's operation page accept the stored
`@NAME/ID`, or `ID` when one principal has it; when several have it, they say so and list them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import view
from tests.integration.test_owners_and_scopes import start_args, team
from tests.support.fake_provider import FakeProvider, pending
from tests.support.live import db_argument, pollwarden_cli

# SQLite only: the subject is how operators name an operation (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.one_engine]


async def test_audit_show_takes_the_agents_id_when_one_principal_has_it_and_names_the_owners_when_several(
    tmp_path: Path, fake: FakeProvider
) -> None:
    for job in ("ja", "jb", "jc"):
        fake.script(job, [pending("running")])
    async with team(tmp_path, fake) as t:
        async with t.as_("alice") as alice:
            view(await alice.call_tool("start_operation", start_args("mine", "ja")))
            view(await alice.call_tool("start_operation", start_args("solo", "jc")))
        async with t.as_("bob") as bob:
            view(await bob.call_tool("start_operation", start_args("mine", "jb")))
        db = db_argument(t.s.h.database)

    solo = pollwarden_cli("audit", "show", "--db", db, "solo")
    assert solo.code == 0, solo.stderr
    assert "job jc" in solo.stdout or "tracking" in solo.stdout
    owned = pollwarden_cli("audit", "show", "--db", db, "@bob/mine")
    assert owned.code == 0, owned.stderr
    assert "jb" in owned.stdout
    both = pollwarden_cli("audit", "show", "--db", db, "mine")
    assert both.code != 0
    assert "2 principals have an operation 'mine' ('@alice/mine', '@bob/mine')" in both.stderr
    assert "give one with its owner" in both.stderr
    unknown = pollwarden_cli("audit", "show", "--db", db, "nothing-here")
    assert unknown.code != 0
    assert "no operation 'nothing-here' in the audit" in unknown.stderr
