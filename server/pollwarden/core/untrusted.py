"""Showing untrusted text to a person: one line, escaped, capped, visibly quoted.

Operation ids, job ids, provider states and errors, an agent's reason: any of
them may hold a newline (to add a forged "Stopped because:" line to a question),
a terminal escape sequence (``ESC[1A ESC[2K`` erases the line above in a
terminal) or a right-to-left override. Everything pollwarden shows a person —
the approval question, the escalation block, the CLI, the audit story, the logs
— goes through this module:

* :func:`quoted` renders one untrusted value: on one line, every character that
  is not printable escaped (``\\n``, ``\\x1b``, ``\\u202e``), cut at a visible
  cap, and wrapped in double quotes (with ``"`` and ``\\`` escaped inside) unless
  it is a plain token that cannot read as more than one word.
* :func:`one_line` renders a line pollwarden composed that may carry stored text
  (a note, a stored question): the same escaping and a cap, without quotes.
* :class:`OneLineFormatter` applies the same escaping to every log message, so
  a newline in a logged value cannot forge a log line.
"""

from __future__ import annotations

import logging
import re

__all__ = ["DEFAULT_LIMIT", "OneLineFormatter", "escape_controls", "one_line", "quoted"]

DEFAULT_LIMIT = 120
"""Characters of one untrusted value shown before the cut."""

# Short enough to read at a glance, ASCII only (no lookalikes), no spaces or
# punctuation that could make it read as more than one word.
_PLAIN_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]*")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """`text` with every character that is not printable escaped, so it stays on one line.

    Control characters (newlines, ESC, DEL, C1), format characters (bidi
    overrides, zero-width joiners), line and paragraph separators and spaces
    other than " " become visible escapes such as ``\\n``, ``\\x1b`` or ``\\u202e``.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def _cut(text: str, limit: int) -> tuple[str, int]:
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def _more(hidden: int) -> str:
    return f" (+{hidden} more characters not shown)" if hidden else ""


def one_line(value: object, *, limit: int = 300) -> str:
    """A line of pollwarden's own text that may embed stored text: escaped, capped, no quotes."""
    text, hidden = _cut(value if isinstance(value, str) else str(value), limit)
    return escape_controls(text) + ("…" if hidden else "") + _more(hidden)


def quoted(value: object, *, limit: int = DEFAULT_LIMIT, bare_tokens: bool = True) -> str:
    """One untrusted value for a person to read: one line, escaped, capped, clearly delimited.

    A plain token (ASCII letters, digits and ``._:/@+=-``, no spaces) is shown
    as it is, so ``exp_71c`` and ``running`` read as in the source document;
    anything else is wrapped in double quotes, with ``"`` and ``\\`` escaped
    inside, so where the value ends is never in doubt. ``bare_tokens=False``
    quotes tokens too (for free text such as an agent's reason). A value longer
    than ``limit`` characters is cut, marked with ``…`` inside the quotes and
    followed by how many characters were not shown.
    """
    text, hidden = _cut(value if isinstance(value, str) else str(value), limit)
    if bare_tokens and not hidden and _PLAIN_TOKEN.fullmatch(text):
        return text
    inner = escape_controls(text.replace("\\", "\\\\").replace('"', '\\"'))
    return f'"{inner}{"…" if hidden else ""}"{_more(hidden)}'


class OneLineFormatter(logging.Formatter):
    """A log formatter whose messages stay on one line: logged values cannot forge log lines.

    Only the message is escaped; a traceback that follows it keeps its lines.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The formatted message with every non-printable character escaped."""
        return escape_controls(super().formatMessage(record))


# How much of a rejected value is echoed back (escaped, on one line).
SHOWN_VALUE_CHARS = 60


def shown(value: object) -> str:
    """A rejected value as the agent sees it: escaped and cut to a visible length."""
    text = repr(value)
    if len(text) > SHOWN_VALUE_CHARS:
        text = text[: SHOWN_VALUE_CHARS - 1] + "…"
    return text
