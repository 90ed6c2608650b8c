"""What the tests and the benchmarks share, and the product never ships.

* `fake_provider`: a scriptable, hostile fake job provider (gzip bombs, trickled
  bodies, dropped connections, any status code) on 127.0.0.1.
* `live`: provider tables for it, `pollwarden serve` subprocesses, the database read directly.
* `serve_with_faults`: `pollwarden serve` with the crash hook and a short lease.
* `crash` and `race`: the crash-injection and the many-process race, in CI and benchmark sizes.
"""
