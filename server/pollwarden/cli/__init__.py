"""The `pollwarden` command line: one module per command group."""
