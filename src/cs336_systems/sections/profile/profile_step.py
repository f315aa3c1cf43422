"""nsys_profile (assignment §1.2): where the time of one model configuration goes, by kernel and
by named range (forward, loss, backward, optimizer; inside attention, its three parts).

    python -m cs336_systems.sections.profile.profile_step --size small --context-length 256 \
        --mode train-step --tool torch --output r.json

The job first times the configuration with the harness (warm-up, then measured steps, no
profiler), then profiles `--measure-steps` more steps with torch.profiler, whose schedule
drops one warm-up step of its own; the record holds both timings, the device time by kernel and
range, the ranges' times and the attention parts' FLOPs; the gzipped Chrome/Perfetto trace lies
beside it. `--tool nsys` runs the same steps under Nsight Systems instead (capture limited by
the NVTX range `measured`, so warm-up is left out) and reads `nsys stats` into the same kernel
rows; without `nsys` on the PATH it records `skipped`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cs336_systems.pipeline.cli import section_parser
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.pipeline.records import resolve_device, run_and_record
from cs336_systems.sections.profile.step_profile import (
    TOOLS,
    measure_nsys,
    measure_torch,
    run_under_nsys,
)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = section_parser(__doc__)
    add_lm_step_arguments(parser, warmup_steps=3, measure_steps=3, attention="annotated")
    parser.add_argument("--tool", default="torch", choices=TOOLS)
    parser.add_argument("--trace", default=None,
                        help="the trace (torch: .trace.json.gz) or report (nsys: .nsys-rep) "
                             "to write; default: beside --output")
    parser.add_argument("--under-nsys", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items()
              if k not in ("output", "device", "under_nsys")}
    suffix = ".nsys-rep" if args.tool == "nsys" else ".trace.json.gz"
    config["trace"] = config["trace"] or str(Path(args.output).with_suffix(suffix))
    if args.under_nsys:  # the process nsys launched: run the steps, write nothing
        run_under_nsys(config, resolve_device(args.device))
        return None
    if args.tool == "nsys":
        measure = lambda device: measure_nsys(config, device, argv)  # noqa: E731
    else:
        measure = lambda device: measure_torch(config, device)  # noqa: E731
    return run_and_record("profile", config, args.output, measure, args.device)


if __name__ == "__main__":
    main()

