"""Section 4.6: a training step against stock parts.

Our model's training step (our FA2 or SDPA, our AdamW written out or fused in Triton, eager or
compiled) beside what a user would run instead (torch's fused AdamW, SDPA's cuDNN attention,
Hugging Face's Llama), and the optimizer's step alone beside the bandwidth floor.

    runs.py              the runs of the table, each defined once
    time_training.py     CLI: one run's training steps (rule training)
    step_timing.py       what it measures
    time_optimizer.py    CLI: every optimizer's step at one size, one process (rule optimizer_step)
    optimizer_timing.py  what it measures
    report.py            records -> tables, facts
    template.md.j2       facts -> prose
"""
