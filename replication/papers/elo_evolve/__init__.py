"""Elo-Evolve: the noise analysis (notebook 01) and pairwise GRPO with Elo opponent selection (notebook 02)."""
