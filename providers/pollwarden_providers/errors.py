"""The root of pollwarden's exception tree, defined here so the provider tables' errors belong to it.

This package never imports the server, so the root lives with it; the server's
errors derive from the same class, and the whole tree is drawn once, at the top
of ``pollwarden/core/errors.py``.
"""

from __future__ import annotations


class PollwardenError(Exception):
    """Base of every error pollwarden raises on purpose; its message says what was wrong and how to fix it."""
