"""Notebook 00's own code: the RLVR yardstick (does GRPO with the exact verifier teach this model, and how fast)."""
