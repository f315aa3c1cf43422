"""One training step of the section's table (`runs.RUNS`): forward, loss, backward and the
optimizer's step, timed, with the job's own bf16 matmul ceiling.

    python -m cs336_systems.sections.training.time_training --run ours-flash-triton-fused-compiled \
        --size 2.7b --context-length 512 --batch-size 4 --output r.json

Times `--measure-steps` steps after `--warmup-steps` (compilation happens in the warm-up) with
the timing harness, each phase on its own (`step_ms_*`, `optimizer_ms_*`, ...), then three
times `--measure-steps` whole steps back to back, as a training loop runs them
(`loop_step_ms_*`: the step time the report compares), all under autocast to `--precision`
(fp32 weights and optimizer state; a run with `master_weights` holds its matmul weights as
bf16 copies of fp32 masters kept by the fused optimizer). The
record has each phase's times, the peak memory, the model FLOPs of a step (3x the forward's
matmuls) and the rate of a large bf16 matrix product measured in the same process, against
which the report puts the step's rate. A run this machine cannot take (Hugging Face's
transformers missing, SDPA's cuDNN backend unavailable, a Triton kernel in bf16 on a CPU)
records `skipped` with the reason.
"""

from __future__ import annotations

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import non_negative_int, positive_int, record_run, section_parser
from cs336_systems.pipeline.options import check_context_length
from cs336_systems.sections.training.runs import RUNS
from cs336_systems.sections.training.step_timing import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--run", required=True, choices=list(RUNS))
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--warmup-steps", type=non_negative_int, default=3)
    parser.add_argument("--measure-steps", type=positive_int, default=5)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    return record_run("training", args, measure)


if __name__ == "__main__":
    main()

