"""Language-model machinery: models, tasks, training, GRPO, DPO, judges, Elo, trained arms and the benchmark.
Imports the core; never a paper."""
