"""mixed_precision_accumulation and benchmarking_mixed_precision (a), (b) (assignment 1.3, 1.4):
one part per job, one record.

    python -m cs336_systems.sections.mixed_precision.run_study --part accumulation --output r.json \
        [--steps 1000 --increment 0.01]
    python -m cs336_systems.sections.mixed_precision.run_study --part toy-model --precision fp16 \
        --output r.json [--batch-size 8 --in-features 20 --out-features 5]
    python -m cs336_systems.sections.mixed_precision.run_study --part layernorm --output r.json \
        [--rows 256 --width 1024 --offsets 0 300 --std-min 0.1 --std-max 10 --eps 1e-5]

accumulation: the assignment's four loops (`mixed_precision.ACCUMULATION_LOOPS`), each result
and its error split into the rounding of the value and of the sum. toy-model: the dtypes
autocast to `--precision` gives the toy model's tensors, read with hooks. layernorm: LayerNorm
of activations at each offset, rounded to every precision and computed by each method of
`mixed_precision.LAYERNORM_METHODS`, against fp64. Everything runs on the job's device. Part
(c), bf16 against fp32 timings, is the benchmark's precision sweep, not a job here.
"""

from __future__ import annotations

from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import positive_float, positive_int, section_parser
from cs336_systems.pipeline.records import run_and_record
from cs336_systems.sections.mixed_precision.study import MEASURE, PARTS


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--part", required=True, choices=list(PARTS))
    group = parser.add_argument_group("accumulation")
    group.add_argument("--steps", type=positive_int, default=1000)
    group.add_argument("--increment", type=positive_float, default=0.01)
    group = parser.add_argument_group("toy-model")
    group.add_argument("--precision", default="fp16", choices=list(PRECISIONS),
                       help="autocast to this dtype (fp32: no autocast)")
    group.add_argument("--batch-size", type=positive_int, default=8)
    group.add_argument("--in-features", type=positive_int, default=20)
    group.add_argument("--out-features", type=positive_int, default=5)
    group = parser.add_argument_group("layernorm")
    group.add_argument("--rows", type=positive_int, default=256)
    group.add_argument("--width", type=positive_int, default=1024)
    group.add_argument("--offsets", type=float, nargs="+", default=[0.0, 300.0])
    group.add_argument("--std-min", type=positive_float, default=0.1)
    group.add_argument("--std-max", type=positive_float, default=10.0)
    group.add_argument("--eps", type=positive_float, default=1e-5)
    args = parser.parse_args(argv)
    if args.std_min > args.std_max:
        parser.error(f"--std-min ({args.std_min}) must not exceed --std-max ({args.std_max})")
    config = {"part": args.part, **{k: getattr(args, k) for k in PARTS[args.part]},
              "seed": args.seed}
    return run_and_record("mixed_precision", config, args.output,
                          lambda device: MEASURE[args.part](config, device), args.device)


if __name__ == "__main__":
    main()

