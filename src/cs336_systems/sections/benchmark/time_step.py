"""benchmarking_script (assignment §1.1): time one model configuration.

    python -m cs336_systems.sections.benchmark.time_step --size small --context-length 128 \
        --mode train-step --precision bf16 --warmup-steps 5 --measure-steps 10 --output r.json

With --compile the model is `torch.compile`d (torch_compile (b), assignment 3.2): the first
warm-up step then includes the compilation.
"""

from __future__ import annotations

import argparse

from cs336_systems.pipeline.cli import record_run, section_parser
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.sections.benchmark.step_timing import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    add_lm_step_arguments(parser, warmup_steps=5, measure_steps=10)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="torch.compile the whole model (torch_compile, assignment 3.2)")
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    return record_run("benchmark", args, measure)


if __name__ == "__main__":
    main()

