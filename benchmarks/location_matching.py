"""How long matching a hostile `Location` against a status path takes: the old regex vs segment matching.

Before issue 14.4 a `Location` was matched with a regex built from the status
path, one `[^/]+` group per placeholder. With placeholders in one segment
(`{owner}{repo}`, `{a}-{b}`) that regex backtracks polynomially; a crafted
header blocked the event loop for seconds. Tables now give each placeholder its
own segment and `match_path` compares segments without a regex. This script
times both on the same crafted paths (the old way on the template it used to
accept, bounded in size so it ends) and prints the ratio.

    python -m benchmarks.location_matching
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from pollwarden_providers.request_building import match_path

# The old matcher, as it was (the baseline measured in the same run).
_OLD_SPLIT = re.compile(r"(\{[a-z_][a-z0-9_]*\})")


def old_match(template: str, path: str) -> bool:
    """The pre-14.4 matcher: one greedy group per placeholder, a full match."""
    pattern = "".join(
        f"(?P<{piece[1:-1]}>[^/]+)" if piece.startswith("{") else re.escape(piece)
        for piece in _OLD_SPLIT.split(template)
        if piece
    )
    return re.fullmatch(pattern, path) is not None


def timed(function: Callable[[str, str], object], template: str, path: str) -> float:
    """Seconds one call takes."""
    start = time.perf_counter()
    function(template, path)
    return time.perf_counter() - start


def main() -> None:
    old_template = "/v1/jobs/{a}-{b}-{c}/{run_id}"  # three placeholders in one segment: accepted before
    new_template = "/v1/jobs/{a}/{b}/{c}/{run_id}"  # what a table must write now
    print(f"{'path length':>12} {'old regex (s)':>14} {'segments (s)':>13} {'ratio':>10}")
    for size in (100, 200, 400, 800):
        crafted = "/v1/jobs/" + "-" * size + "/x/"  # never matches: every split is tried
        old = timed(old_match, old_template, crafted)
        new = timed(match_path, new_template, crafted)
        print(f"{len(crafted):>12} {old:>14.4f} {new:>13.6f} {old / max(new, 1e-9):>10.0f}")
    long = "/v1/jobs/" + "a" * 1_000_000 + "/b/c/7/"
    print(f"segment matching on a 1 MB Location: {timed(match_path, new_template, long):.4f} s")


if __name__ == "__main__":
    main()
