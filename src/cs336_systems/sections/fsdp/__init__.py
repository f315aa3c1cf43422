"""Section 6.2 fsdp, fsdp_accounting (2026).

Our FSDP beside torch's fully_shard and bucketed DDP: step time, peaks, whether prefetch hid the
gathers.

    time_fsdp.py    CLI: one variant (rule fsdp)
    fsdp_timing.py  what it measures
    report.py       records -> tables, figures, facts
    template.md.j2facts -> prose
"""
