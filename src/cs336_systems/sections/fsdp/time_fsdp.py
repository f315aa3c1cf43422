"""fsdp and fsdp_accounting (§6.2, 2026): this project's FSDP beside torch's FSDP2 and DDP.

    python -m cs336_systems.sections.fsdp.time_fsdp --variant fsdp --size 2.7b --context-length 512 \
        --batch-size 8 --world-size 2 --output r.json [--trace r.trace.json.gz]

Times training steps of the LM (this project's AdamW, the batch split over the ranks) wrapped
in one of `FSDP_VARIANTS`: `fsdp` (cs336_systems.distributed.FSDP), `fsdp2` (torch's
`fully_shard` on each block and on the root: the reference) and `bucketed` (DDPBucketed, every
rank holding everything). Phases as in the DDP benchmark (`communicate` is the exposed wait in
finish_gradient_synchronization). The record has each rank's peak memory, the sharding
breakdown of the model (what FSDP shards and what it keeps whole, in bytes: fsdp_accounting
(a)), and for `fsdp` on CUDA, from a profiler trace of the last steps, each forward use's
all-gather against the moment its layer could have started (fsdp_accounting (b),
`gather_timing`).
"""

from __future__ import annotations

from cs336_systems.distributed.variants import FSDP_VARIANTS
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import section_parser
from cs336_systems.pipeline.options import add_training_arguments, training_config
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.fsdp.fsdp_timing import work


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--variant", required=True, choices=list(FSDP_VARIANTS))
    parser.add_argument("--compute-dtype", choices=[p for p in PRECISIONS if p != "fp32"],
                        default=None, help="gather and compute in this dtype (default: fp32)")
    add_training_arguments(parser, size="2.7b", context_length=512, batch_size=8,
                           warmup_steps=2, measure_steps=5)
    config, output, _ = training_config(parser, argv)
    launch_or_work("cs336_systems.sections.fsdp.time_fsdp", "fsdp", config, output, work,
                   config["world_size"], config["backend"], argv)


if __name__ == "__main__":
    main()

