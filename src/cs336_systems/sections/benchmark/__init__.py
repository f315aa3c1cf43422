"""Section 1.1 benchmarking_script.

Timings of one LM step per (size, context, mode, precision), and the warm-up ablation.

    time_step.py    CLI: one step's phases timed (rules benchmark, benchmark_compiled)
    step_timing.py  what it measures
    report.py       records -> tables, figures, facts
    template.md.j2facts -> prose
"""
