"""Which stored operation an operator's name means (`pollwarden.access.operation_names`)."""

from __future__ import annotations

from pollwarden.access.operation_names import owner_pattern, resolve_name


def test_the_stored_id_as_given_wins_over_an_owned_one_of_the_same_name() -> None:
    assert resolve_name("mine", ["mine", "@alice/mine"]).operation_id == "mine"
    assert resolve_name("@alice/mine", ["@alice/mine", "@bob/mine"]).operation_id == "@alice/mine"


def test_an_id_one_principal_has_is_found_without_its_owner() -> None:
    assert resolve_name("solo", ["@alice/solo"]).operation_id == "@alice/solo"


def test_an_id_several_principals_have_is_refused_naming_them() -> None:
    named = resolve_name("mine", ["@bob/mine", "@alice/mine"])
    assert named.operation_id is None
    assert named.ambiguous
    assert named.problem is not None
    assert "'@alice/mine', '@bob/mine'" in named.problem


def test_a_suffix_that_is_not_a_whole_id_does_not_match() -> None:
    named = resolve_name("ine", ["@alice/mine"])
    assert named.operation_id is None
    assert not named.ambiguous


def test_the_like_pattern_escapes_the_wildcards_in_the_name() -> None:
    assert owner_pattern("a_b%c\\d") == "@%/a\\_b\\%c\\\\d"


def test_a_stored_id_names_its_principal_and_an_id_without_the_prefix_is_the_local_users() -> None:
    from pollwarden.access.ownership import owner_of, stored_id
    from pollwarden.access.principals import LOCAL, Principal

    alice = Principal("alice", authenticated=True)
    assert owner_of(stored_id(alice, "report-1")) == "alice"
    assert owner_of(stored_id(LOCAL, "report-1")) == "local"
    assert owner_of("@jwt:sub-7/x/y") == "jwt:sub-7"
