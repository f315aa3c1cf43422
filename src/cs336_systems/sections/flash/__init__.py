"""Section 4 flash_benchmarking, flash leaderboard (2025).

Our FlashAttention-2 beside PyTorch and SDPA's backends; the speed targets.

    time_flash.py    one implementation at one shape (rules flash, flash_leaderboard)
    time_targets.py  one group of speed targets, ours and its references in one process
                     (rule flash_speed)
    cold_compile.py  the leaderboard case compiled from empty caches (run by time_targets)
    targets.py       the speed targets, each defined once
    speed_table.py   the speed table from the group records
    report.py        records -> tables, figures, facts
    template.md.j2   facts -> prose
"""
