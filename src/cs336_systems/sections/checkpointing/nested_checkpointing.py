"""gradient_checkpointing (a), measured (assignment §2): the nested checkpoint strategies of
`cs336_systems.analysis.checkpoint_trees` run on real TransformerBlocks, beside the simulator's numbers.

    python -m cs336_systems.sections.checkpointing.nested_checkpointing --size tiny --context-length 64 \
        --batch-size 2 --blocks 1 2 4 8 --device cpu --output r.json

For each N in `--blocks` and each strategy (`checkpointing.STRATEGIES`, and the simulator's
optimum in the units measured here), one forward + backward of N blocks of `--size`'s shape
(parameters frozen out of the gradient, so the peak is activations): the peak bytes above what
was alive before (`memory.peak_window`: the live-tensor stand-in on a CPU, the allocator on a
GPU), the blocks' forward calls (recomputations included), and the simulator's peak and
compute for the same tree with its units measured on one block here (`block_units`).
"""

from __future__ import annotations

from cs336_systems.lm.attention import ATTENTION_IMPLEMENTATIONS
from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.pipeline.cli import parsed_config, positive_int, record_run, section_parser
from cs336_systems.pipeline.options import check_context_length
from cs336_systems.sections.checkpointing.nested import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES),
                        help="the shape of each block (d_model, heads, d_ff)")
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--batch-size", type=positive_int, default=2)
    parser.add_argument("--blocks", type=positive_int, nargs="+", required=True,
                        help="chain lengths N to measure")
    parser.add_argument("--attention", default="eager", choices=list(ATTENTION_IMPLEMENTATIONS))
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {**parsed_config(args), "blocks": sorted(set(args.blocks))}
    return record_run("checkpointing", args, measure, config)


if __name__ == "__main__":
    main()

