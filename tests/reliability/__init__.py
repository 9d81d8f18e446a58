"""Reliability suite (issue 9): load, soak, faults, hostile input, secrets. See docs/reliability.md."""
