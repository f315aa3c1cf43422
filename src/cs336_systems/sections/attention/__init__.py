"""Section 3.1-3.2 pytorch_attention, torch_compile.

Eager attention and torch.compile of it by (d, seq), under a memory cap; the whole model compiled.

    time_attention.py    CLI: one (d, seq, variant, cap) (rule attention)
    attention_timing.py  what it measures
    report.py            records -> tables, figures, facts
    template.md.j2       facts -> prose
"""
