"""Section 1.2 nsys_profile.

Where a step's device time goes: kernels by range, matmul share, attention's parts.

    profile_step.py  CLI: one step profiled (rule profile)
    step_profile.py  what it measures
    report.py        records -> tables, figures, facts
    template.md.j2   facts -> prose
"""
