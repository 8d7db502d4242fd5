"""Past one machine: the papers' pieces on TRL and accelerate, and the `train` command."""
