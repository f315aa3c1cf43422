"""autograd_residuals (assignment §2, 2026) and memory_profiling (f) (§1.5): what one module's
forward saves for backward, eager or compiled, and what its backward produces.

    python -m cs336_systems.sections.residuals.count_saved --target block --size 2.7b --num-heads 16 \
        --batch-size 4 --context-length 2048 --variant compiled --output r.json
    python -m cs336_systems.sections.residuals.count_saved --target rmsnorm --d-model 2560 \
        --batch-size 4 --context-length 2048 --variant eager --output r.json

`--target block` is one TransformerBlock of a model size (plain PyTorch attention), with
`--num-heads` in place of the size's own (the handout's xl block has 16 heads, ours 32);
`--target rmsnorm` one RMSNorm of width `--d-model`. The input is (batch, context, d_model),
random, requiring its gradient. `--variant compiled` runs `torch.compile(module,
fullgraph=True)` through inductor, after one forward and backward that compile it. The measured
forward runs inside `residuals.SavedTensors` (saved-tensor hooks; see `cs336_systems.measure.saved_tensors`
for how storages are counted and named); then a backward with a random output gradient, after
which the gradients' bytes are read. The record puts beside them the analytic model's values
(`memory_model`: the block's residuals with the heads used, its gradients; an RMSNorm's eager
residuals are the block's RMSNorm-1 entries) and, on CUDA, the allocator's peak during the
forward and what the forward left allocated.
"""

from __future__ import annotations

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import positive_int, record_run, section_parser
from cs336_systems.sections.residuals.saved import TARGETS, VARIANTS, measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--target", required=True, choices=TARGETS)
    parser.add_argument("--variant", default="eager", choices=VARIANTS)
    parser.add_argument("--size", choices=list(MODEL_SIZES),
                        help="the block's model size (--target block)")
    parser.add_argument("--num-heads", type=positive_int, default=None,
                        help="heads of the block, in place of the size's own")
    parser.add_argument("--d-model", type=positive_int, default=None,
                        help="the RMSNorm's width (--target rmsnorm)")
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                        help="fp32, or autocast to bf16 / fp16")
    args = parser.parse_args(argv)
    if args.target == "block":
        if args.size is None:
            parser.error("--target block needs --size")
        spec = MODEL_SIZES[args.size]
        args.num_heads = args.num_heads or spec.num_heads
        if spec.d_model % args.num_heads:
            parser.error(f"--num-heads {args.num_heads} does not divide size {args.size!r}'s "
                         f"d_model {spec.d_model}")
        if args.d_model not in (None, spec.d_model):
            parser.error(f"--d-model {args.d_model} is not size {args.size!r}'s d_model "
                         f"{spec.d_model}")
        if args.context_length > spec.max_context_length:
            parser.error(f"--context-length {args.context_length} is longer than size "
                         f"{args.size!r} supports (at most {spec.max_context_length})")
        args.d_model = spec.d_model
    else:
        if args.d_model is None:
            parser.error("--target rmsnorm needs --d-model")
        if args.size is not None or args.num_heads is not None:
            parser.error("--size and --num-heads are for --target block")
    return record_run("residuals", args, measure)


if __name__ == "__main__":
    main()

