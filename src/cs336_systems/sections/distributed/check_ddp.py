"""naive_ddp (§5.2): does data-parallel training end where single-process training does?

    python -m cs336_systems.sections.distributed.check_ddp --world-size 2 --steps 3 --output r.json

On CPUs with gloo (seconds, in every preset): each rank builds the LM from its own seed, so the
replicas start apart; each variant of `DDP_CHECK_VARIANTS` makes them equal (rank 0's weights),
trains `--steps` AdamW steps with each rank on its rows of the batch, and is compared with one
process training the same initial weights on the whole batch. Per variant the record holds
`checks`: the largest absolute difference of any parameter from the single-process run, whether
every parameter is bitwise equal (`equal`) and whether it is within torch.testing's float32
tolerances (`allclose`, `rtol`/`atol`), how far the replicas are apart (`replicas_max_abs_diff`),
and how far training moved the weights (`moved_max_abs`: a check of weights that never moved
would prove nothing).
"""

from __future__ import annotations

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.pipeline.cli import parsed_config, positive_int, section_parser
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.distributed.ddp_equivalence import work


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--size", default="tiny", choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=16)
    parser.add_argument("--batch-size", type=positive_int, default=4, help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--steps", type=positive_int, default=3)
    args = parser.parse_args(argv)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    config = parsed_config(args)
    config["backend"] = "gloo"
    launch_or_work("cs336_systems.sections.distributed.check_ddp", "ddp_check", config, args.output,
                   work, args.world_size, "gloo", argv)


if __name__ == "__main__":
    main()

