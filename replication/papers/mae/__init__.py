"""Multi-Agent Evolve: Proposer, Solver and Judge, Task-Relative REINFORCE++ (notebook 06)."""
