"""pytorch_attention and torch_compile (a) (assignment 3.1, 3.2): attention alone at one shape.

    python -m cs336_systems.sections.attention.time_attention --d 64 --seq 4096 --output r.json \
        [--compile] [--memory-cap-gib 24] [--batch-size 8 --warmup-steps 5 --measure-steps 100]

q, k, v of shape (batch, seq, d) in fp32, no head dimension, through the registry's `eager`
attention, or `torch.compile` of it. The harness times `measure_steps` forward passes (after
`warmup_steps` untimed ones), then reads the memory in use after one more forward, before its
backward, then times `measure_steps` backward passes (each after an untimed forward that builds its graph),
synchronizing after each. The first forward and backward are kept apart (`first_*_ms`): with
`--compile` they include compilation. An out-of-memory is a result: status `oom`, the pass that
ran out (`oom_pass`), and what was measured before it. `--memory-cap-gib` caps this process's
share of the GPU, to show where a 24, 40 or 80 GB card runs out.
"""

from __future__ import annotations

import argparse

from cs336_systems.pipeline.cli import non_negative_int, positive_int, record_run, section_parser
from cs336_systems.sections.attention.attention_timing import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--d", type=positive_int, required=True, help="head dimension")
    parser.add_argument("--seq", type=positive_int, required=True, help="sequence length")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="time torch.compile(eager attention)")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=5)
    parser.add_argument("--measure-steps", type=positive_int, default=100)
    parser.add_argument("--memory-cap-gib", type=float, default=None,
                        help="let this process use at most this much GPU memory")
    args = parser.parse_args(argv)
    if args.compile and args.warmup_steps < 1:
        parser.error("--compile needs --warmup-steps of at least 1, or compilation lands in the timings")
    if args.memory_cap_gib is not None and args.memory_cap_gib <= 0:
        parser.error(f"--memory-cap-gib must be positive, got {args.memory_cap_gib}")
    return record_run("attention", args, measure)


if __name__ == "__main__":
    main()

