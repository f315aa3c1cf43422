"""memory_profiling (assignment §1.5): the CUDA caching allocator's history over measured steps of
one model configuration, and what it says: peaks, the stage of the peak, the largest allocations
and the lines of this project that made them, what is live at the peak.

    python -m cs336_systems.sections.memory.record_memory --size 2.7b --context-length 512 \
        --mode train-step --precision bf16 --output r.json

The job runs the warm-up steps first, outside the recording (the optimizer state exists from the
first step on), then records the allocator's history (`torch.cuda.memory._record_memory_history`,
Python stacks) over `--measure-steps` steps run through the timing harness with each phase's start
noted, takes the snapshot and stops recording. Beside the record, named after it:

    <record>.snapshot.pickle.gz   the snapshot (gunzip it for pytorch.org/memory_viz)   heavy
    <record>.memory_viz.html      torch's own viewer, the snapshot inside (it loads
                                  MemoryViz.js from cdn.jsdelivr.net: needs a network)   heavy
    <record>.timeline.json.gz     the compact timeline (`memory_timeline.Timeline`) that the
                                  section's figures and tables are drawn from            small

Memory history needs the CUDA caching allocator: on a CPU the record is `skipped`.
"""

from __future__ import annotations

from cs336_systems.pipeline.cli import positive_int, section_parser
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.pipeline.records import run_and_record
from cs336_systems.sections.memory.memory_history import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    add_lm_step_arguments(parser, warmup_steps=2, measure_steps=2)
    parser.add_argument("--max-entries", type=positive_int, default=200_000,
                        help="the allocator history's ring buffer: events kept (the oldest "
                             "are dropped beyond it)")
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items() if k != "device"}
    return run_and_record("memory", {k: v for k, v in config.items() if k != "output"},
                          args.output, lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()

