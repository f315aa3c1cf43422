"""Models and algebra that predict what the jobs measure: memory_model.py (bytes of a step),
checkpoint_trees.py (nested checkpointing: simulator and optimum), attention_memory.py (what
eager attention holds), parallelism.py (§7 in sympy), mixed_precision.py (accumulation, autocast
dtypes, LayerNorm errors), communication.py (2026's communication accounting)."""
