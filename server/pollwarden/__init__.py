"""pollwarden: bounded waiting on external asynchronous jobs, as an MCP server."""

__version__ = "0.1.0"
