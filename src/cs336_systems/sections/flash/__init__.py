"""Section 4 flash_benchmarking, flash leaderboard (2025).

Our FlashAttention-2 beside PyTorch and SDPA's backends; the speed targets; where the kernels'
time goes. Each job's CLI parses its arguments and calls one measuring module:

    time_flash.py       CLI: one implementation at one shape (rules flash, flash_leaderboard)
    latency.py          its measurement: forward, backward, forward+backward
    time_targets.py     CLI: one group of speed targets (rule flash_speed)
    speed.py            its measurement: ours and the group's references in one process
    cold_compile.py     CLI: the leaderboard case compiled from empty caches (speed.py's child)
    kernel_profile.py   CLI: one shape's kernels, variant by variant (rule flash_kernels)
    kernel_timings.py   its measurement: each kernel's device time, our binaries' demands
    kernel_variants.py  the profile's variants, passes and matmul units
    targets.py          the speed targets, each defined once
    speed_table.py      the speed table from the group records
    kernel_table.py     the kernel table from the profile records
    report.py           records -> tables, figures, facts
    template.md.j2      facts -> prose
"""
