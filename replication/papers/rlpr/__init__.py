"""RLPR: the probability reward, debiasing, the adaptive std filter and the reward-quality study (notebook 03)."""
