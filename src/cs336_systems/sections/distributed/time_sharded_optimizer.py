"""optimizer_state_sharding (§4.7): memory and step time with and without ShardedOptimizer.

    python -m cs336_systems.sections.distributed.time_sharded_optimizer --sharded --size xl \
        --context-length 128 --batch-size 8 --world-size 2 --output r.json

Data-parallel AdamW training of the LM (flat gradient all-reduce), with the optimizer either
replicated (`--no-sharded`, torch.optim-style AdamW on every rank) or wrapped in
ShardedOptimizer. Memory, on every rank (rank 0 gathers them into `memory_per_rank`, rank 0's
own are also the flat metrics), as allocator peaks (`max_memory_allocated`, the peak reset at
the start of each window) over three windows, and the allocation at their ends:

    init         building the model and the optimizer        peak_gib_init, allocated_gib_after_init
    before_step  forward, backward and the all-reduce, up to  peak_gib_before_step,
                 directly before optimizer.step()             allocated_gib_before_step
    step         optimizer.step() itself                      peak_gib_step, allocated_gib_after_step

(the largest peak over the measured steps; AdamW creates its state in the first step, so the
init window holds no optimizer state). Also a breakdown computed from the tensors themselves
(parameters, gradients, this rank's optimizer state) and the phase times. On a CPU the
allocator readings are absent (None) and the breakdown still holds.
"""

from __future__ import annotations

import argparse

from cs336_systems.distributed.launch import backend_for
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.optimizer import FLAT_OPTIMIZERS
from cs336_systems.pipeline.cli import non_negative_int, parsed_config, positive_int, section_parser
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.distributed.sharded_optimizer_timing import work


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--sharded", action=argparse.BooleanOptionalAction, required=True)
    parser.add_argument("--size", default="xl", choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=128)
    parser.add_argument("--batch-size", type=positive_int, default=8, help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--warmup-steps", type=non_negative_int, default=2)
    parser.add_argument("--measure-steps", type=positive_int, default=5)
    parser.add_argument("--optimizer", default="adamw", choices=list(FLAT_OPTIMIZERS))
    args = parser.parse_args(argv)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    backend = backend_for(args.device)
    config = parsed_config(args)
    config["backend"] = backend
    launch_or_work("cs336_systems.sections.distributed.time_sharded_optimizer",
                   "sharded_optimizer", config, args.output, work, args.world_size, backend, argv)


if __name__ == "__main__":
    main()

