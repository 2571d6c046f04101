"""Fault tests (docs/testing.md, "Faults"): each one a defect found by a hostile probe, held fixed."""
