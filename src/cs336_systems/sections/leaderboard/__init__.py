"""Section 8 leaderboard (2026).

The 8B model's full training step on two GPUs (or its one-GPU proxy), our fastest
configuration beside the stock parts in one job matrix, and what each lever bought.

    runs.py              the variants and their levers
    time_leaderboard.py  CLI: one variant (rule leaderboard)
    step_timing.py       what it measures
    report.py            records -> table, facts
    template.md.j2       facts -> prose
"""
