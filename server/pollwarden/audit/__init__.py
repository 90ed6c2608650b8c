"""The tamper-evident audit: its rows, the chain, verification and the story a person reads."""
