"""Debate (Khan et al. 2024): stories, protocols, judges, best-of-N and the simulated world (notebook 04)."""
