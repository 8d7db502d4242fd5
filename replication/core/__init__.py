"""The core: configuration, files, the cache, the loop, statistics, verdicts, figures, paper numbers, the
console and parameter classes. Nothing here imports torch, a model, or anything above it."""
