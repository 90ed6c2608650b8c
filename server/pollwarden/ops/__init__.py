"""Operability: metrics, traces, health probes and decision logs."""
