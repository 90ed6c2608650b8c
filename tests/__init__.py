"""pollwarden's tests (a package, so `tests.support` is importable from the benchmarks too)."""
