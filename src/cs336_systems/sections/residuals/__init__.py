"""Section 2 autograd_residuals, 1.5 memory_profiling (f).

What one RMSNorm and one block save for backward, eager and compiled.

    count_saved.py  CLI: one module's saved tensors (rules residuals_rmsnorm, residuals_block)
    saved.py        what it measures
    report.py       records -> tables, figures, facts
    template.md.j2  facts -> prose
"""
