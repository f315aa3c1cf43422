"""naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_* (§4.3-4.5).

    python -m cs336_systems.sections.distributed.time_ddp --variant bucketed --bucket-size-mb 100 \
        --size xl --context-length 128 --batch-size 16 --world-size 2 --output r.json \
        [--trace r.trace.json.gz]

Times data-parallel training steps of the LM (AdamW, batch split over the ranks) with one of
the variants of `cs336_systems.distributed.variants.DDP_VARIANTS` (naive, flat, overlap,
bucketed, and torch's DistributedDataParallel as the reference).
Phases are timed with the harness (synchronize after each). For naive and flat the all-reduces
are their own `communicate` phase; for the overlapped variants communication runs inside the
backward phase and `communicate` is the exposed wait in finish_gradient_synchronization.

After the timed steps, `PROFILE_STEPS` more run under the profiler, each phase inside a
`record_function` range of its name. Rank 0 reads its own trace back (written to --trace, else
to a temporary file) and records, per step: the time during which a collective kernel ran
(`collective_busy_ms_per_step`, overlapping calls counted once), the time any other device work
ran (`compute_busy_ms_per_step`), the time both ran at once (`collective_hidden_ms_per_step`) and
that as a fraction of the collective time (`collective_hidden_fraction`); and `timeline`, the
last profiled step as merged intervals of compute and of collectives, in ms from the step's
first device work, with each phase's device span. The numbers are computed here, where the
trace is, so that the report needs only the record (traces stay out of git). A profile without
any collective is an error, not a missing number: it means `is_collective` no longer knows the
kernels' names.
"""

from __future__ import annotations

from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.pipeline.cli import section_parser
from cs336_systems.pipeline.options import add_training_arguments, training_config
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.distributed.ddp_timing import work


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--variant", required=True, choices=list(DDP_VARIANTS))
    add_training_arguments(parser, size="xl", context_length=128, batch_size=16,
                           warmup_steps=3, measure_steps=10)
    config, output, _ = training_config(parser, argv)
    launch_or_work("cs336_systems.sections.distributed.time_ddp", "ddp", config, output, work,
                   config["world_size"], config["backend"], argv)


if __name__ == "__main__":
    main()

