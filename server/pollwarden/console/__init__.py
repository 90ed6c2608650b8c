"""The operator console: `pollwarden console` serves every wait and every approval to a browser."""
