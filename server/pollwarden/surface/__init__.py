"""The MCP surface: tools, views, the protocol beyond tools, HTTP serving, Tasks and the App card."""
