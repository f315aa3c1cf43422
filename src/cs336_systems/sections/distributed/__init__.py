"""Section 5-6 distributed_communication, ddp, optimizer state sharding, communication_accounting.

All-reduce, every DDP variant beside torch's, the check against one process, the sharded optimizer.

    time_allreduce.py            CLI: one all-reduce configuration (rule allreduce)
    allreduce_timing.py          what it measures
    time_ddp.py                  CLI: one DDP variant (rule ddp)
    ddp_timing.py                what it measures
    check_ddp.py                 CLI: every variant against one process (rule ddp_check)
    ddp_equivalence.py           what it measures
    time_sharded_optimizer.py    CLI: replicated against sharded state (rule sharded_optimizer)
    sharded_optimizer_timing.py  what it measures
    communication_accounting.py  2026's accounting of the XXL model (rule communication_accounting)
    report.py                    records -> tables, figures, facts
    template.md.j2               facts -> prose
"""
