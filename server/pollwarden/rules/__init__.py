"""The rule book: pure decisions (stop conditions, the gate, the schedule, extensions, the pace)."""
