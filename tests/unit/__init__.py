"""Pure tests: no files, network, processes or database; the whole folder runs in seconds."""
