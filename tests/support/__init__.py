"""Helpers the tests share: `checkout` (a clean copy of the repository and Snakemake runs in
it), `distributed` (a toy model and spawned ranks), `memory_traces` (synthetic CUDA memory
snapshots)."""
