"""The optimizer step alone, at one model size: every optimizer of `FLAT_OPTIMIZERS` in one process,
beside the memory-bandwidth floor from a copy measured in the same process.

    python -m cs336_systems.sections.training.time_optimizer --size 2.7b --output r.json

The parameters are the model's (fp32, built on the device), with fp32 gradients of standard
normal noise. For each optimizer in turn: its state is created by one step, then `--rounds`
rounds of do_bench medians of `step()`; the memory its step allocates beyond what the
parameters, gradients and state hold (`extra_gib`: the written-out AdamW's sqrt(v)); then its
state is freed. The floor is the bytes a step must move (read p, g, m, v; write p, m, v: 28 per
fp32 parameter) over the copy's bandwidth (bytes read plus written).
"""

from __future__ import annotations

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.optimizer import FLAT_OPTIMIZERS
from cs336_systems.pipeline.cli import positive_int, record_run, section_parser
from cs336_systems.sections.training.optimizer_timing import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--optimizers", nargs="+", default=list(FLAT_OPTIMIZERS),
                        choices=list(FLAT_OPTIMIZERS))
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args(argv)
    return record_run("optimizer", args, measure)


if __name__ == "__main__":
    main()

