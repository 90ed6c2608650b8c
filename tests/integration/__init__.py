"""Tests of real parts: SQLite files, the fake provider over HTTP, the SDK's client, `pollwarden` processes."""
