"""The MCP App card's pure rules: who may decide on the card, and what a client without Apps is listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollwarden.access.operator_keys import METHOD_APP, DecisionFacts, OperatorPolicy, authenticate
from pollwarden.access.principals import LOCAL, Principal
from pollwarden.config import ServerConfig, load_config
from pollwarden.core.errors import ConfigError
from pollwarden.store import DatabaseLocation
from pollwarden.surface.app_card import APP_ONLY_TOOLS, app_channel_refusal, plain_tool_list

DB = DatabaseLocation.sqlite(Path("/nonexistent/pollwarden.db"))
AGENT = Principal("agent-1", operator=False, authenticated=True)
OPERATOR = Principal("ops", operator=True, authenticated=True)


def config(*, app: bool, require_key: bool = False) -> ServerConfig:
    return ServerConfig(database=DB, app_channel=app, operator=OperatorPolicy(require_key=require_key))


def test_the_card_decides_for_the_local_user_only_once_the_operator_opted_in() -> None:
    assert app_channel_refusal(config(app=True), LOCAL) is None
    refusal = app_channel_refusal(config(app=False), LOCAL)
    assert refusal is not None
    assert "--approval app" in refusal


def test_the_card_never_decides_where_the_operator_requires_a_key() -> None:
    refusal = app_channel_refusal(config(app=True, require_key=True), LOCAL)
    assert refusal is not None
    assert "operator key" in refusal


def test_the_card_never_decides_where_the_databases_policy_does_not_count_the_app_channel() -> None:
    refusal = app_channel_refusal(config(app=True), LOCAL, frozenset({"elicitation", "operator"}))
    assert refusal is not None
    assert "approval policy" in refusal


@pytest.mark.parametrize("principal", [AGENT, OPERATOR], ids=["agent", "operator"])
def test_the_card_never_decides_on_an_authenticated_http_server(principal: Principal) -> None:
    refusal = app_channel_refusal(config(app=True), principal)
    assert refusal is not None
    assert "operator decides" in refusal


def test_approval_app_means_elicitation_plus_the_card_and_a_wrong_word_is_refused_with_the_choices() -> None:
    app = load_config(db="/tmp/x.db", approval="app", environ={})
    assert (app.approval_mode, app.app_channel) == ("elicitation", True)
    assert load_config(db="/tmp/x.db", approval="elicitation,app", environ={}).app_channel
    assert not load_config(db="/tmp/x.db", environ={}).app_channel
    assert load_config(db="/tmp/x.db", environ={"POLLWARDEN_APPROVAL": "app"}).app_channel
    with pytest.raises(ConfigError, match="'app'"):
        load_config(db="/tmp/x.db", approval="card", environ={})


def test_a_card_decision_is_applied_as_app_unless_a_key_is_required() -> None:
    facts = DecisionFacts(
        approval_id="ap-1",
        operation_id="op",
        kind="extension",
        bound_version=1,
        request_json="{}",
        decision="approved",
        decided_at=1.0,
        decided_by="person (MCP App card)",
    )
    accepted = authenticate(facts, METHOD_APP, None, OperatorPolicy())
    assert (accepted.ok, accepted.method) == (True, "app")
    assert not authenticate(facts, METHOD_APP, None, OperatorPolicy(require_key=True)).ok


def test_a_client_without_apps_is_listed_the_tools_without_the_cards_and_without_ui_meta() -> None:
    listed = {
        "tools": [
            {"name": "check_status", "_meta": {"ui": {"resourceUri": "ui://pollwarden/card.html"}}},
            {"name": "get_operation", "_meta": {"ui": {"resourceUri": "x"}, "other": 1}},
            {"name": "list_operations"},
            *({"name": name, "_meta": {"ui": {"visibility": ["app"]}}} for name in APP_ONLY_TOOLS),
        ],
        "nextCursor": None,
    }
    assert plain_tool_list(listed) == {
        "tools": [
            {"name": "check_status"},
            {"name": "get_operation", "_meta": {"other": 1}},
            {"name": "list_operations"},
        ],
        "nextCursor": None,
    }
