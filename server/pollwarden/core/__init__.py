"""The shared words: vocabulary, record types, the exception tree, the clock, and small safe helpers."""
