"""Section 2 gradient_checkpointing.

Nested strategies simulated and measured on real blocks; one level of recomputation at full size.

    time_checkpointing.py    one block size's peak and step time (rule checkpointing)
    nested_checkpointing.py  nested trees on real blocks (rule checkpointing_nested)
    report.py                records -> tables, figures, facts
    template.md.j2           facts -> prose
"""
