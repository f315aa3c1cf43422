"""Section 1.5 memory_profiling (a)-(e).

The CUDA allocator's history over measured steps, its peaks beside the analytic model.

    record_memory.py    CLI: one step's memory history, peaks and timeline (rule memory)
    memory_history.py   what it measures
    timeline_figure.py  the timeline's figure
    report.py           records -> tables, figures, facts
    template.md.j2      facts -> prose
"""
