"""MALT: generator / verifier / refiner trees, value iteration, SFT then DPO per role (notebook 05)."""
