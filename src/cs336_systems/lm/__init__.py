"""The language model and its step: model.py (the Transformer and its size table),
attention.py (the registry of attention implementations), precision.py (precision names and
autocast), loss.py, optimizer.py (AdamW and the registry of optimizers), step.py (one benchmark
step's phases), build.py (one step built from one configuration), hf_llama.py (Hugging Face's
Llama of our shape: the stock model the training section compares with)."""
