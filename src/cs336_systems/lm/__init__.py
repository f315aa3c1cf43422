"""The language model and its step: model.py (the Transformer and its size table),
attention.py (the registry of attention implementations), precision.py (precision names and
autocast), loss.py, optimizer.py (AdamW), step.py (one benchmark step's phases, built from one
configuration)."""
