"""Property-based tests (hypothesis): the pure decisions over generated records and answers, and one end to end."""
