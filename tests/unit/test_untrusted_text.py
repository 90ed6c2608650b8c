"""What a person reads cannot be forged: untrusted values stay on one line, escaped, capped and quoted: the pure checks.

The checks on real files, servers and processes: tests/integration/test_untrusted_text.py.
"""

from __future__ import annotations

from pollwarden.core.untrusted import escape_controls, one_line, quoted


def test_a_plain_token_is_shown_as_it_is() -> None:
    assert quoted("exp_71c") == "exp_71c"
    assert quoted("report-export-2025-04-18-01") == "report-export-2025-04-18-01"


def test_anything_else_is_quoted_with_every_control_character_escaped() -> None:
    assert quoted("a b") == '"a b"'
    assert quoted('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert quoted("x\ny\x1b[2K\u202e") == '"x\\ny\\x1b[2K\\u202e"'
    assert quoted("token", bare_tokens=False) == '"token"'


def test_a_long_value_is_cut_visibly() -> None:
    shown = quoted("x" * 500, limit=10)
    assert shown == '"xxxxxxxxxx…" (+490 more characters not shown)'
    assert one_line("a\nb" * 200, limit=5) == "a\\nba\\n… (+595 more characters not shown)"


def test_escape_controls_keeps_printable_text_and_escapes_the_rest() -> None:
    assert escape_controls("10:20 polled, état «ok»") == "10:20 polled, état «ok»"
    assert escape_controls("a\r\nb\x7f\x9b\u2028") == "a\\r\\nb\\x7f\\x9b\\u2028"
