"""Section 5-6 distributed_communication, ddp, optimizer state sharding, communication_accounting.

All-reduce, every DDP variant beside torch's, the check against one process, the sharded optimizer.

    time_allreduce.py            one all-reduce configuration (rule allreduce)
    time_ddp.py                  one DDP variant (rule ddp)
    check_ddp.py                 every variant against one process (rule ddp_check)
    time_sharded_optimizer.py    replicated against sharded state (rule sharded_optimizer)
    communication_accounting.py  2026's accounting of the XXL model (rule communication_accounting)
    report.py                    records -> tables, figures, facts
    template.md.j2               facts -> prose
"""
