"""The speed targets of our FlashAttention-2 (`cs336_systems.sections.flash.targets`), one
group per job.

    python -m cs336_systems.sections.flash.time_targets --group leaderboard --shapes 16x16384x64 \
        --precision bf16 --rounds 3 --output r.json

What each group measures and the record it writes: `cs336_systems.sections.flash.speed`.
"""

from __future__ import annotations

import argparse

from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import parsed_config, positive_int, record_run, section_parser
from cs336_systems.sections.flash.speed import measure
from cs336_systems.sections.flash.targets import GROUPS, parse_shape


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--group", required=True, choices=list(GROUPS))
    parser.add_argument("--shapes", nargs="*", type=parse_shape, default=[],
                        help="BATCHxSEQxD each (none: the preset has no shape for the group)")
    parser.add_argument("--precision", required=True, choices=list(PRECISIONS))
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved do_bench rounds per implementation and shape")
    args = parser.parse_args(argv)
    config = {**parsed_config(args), "shapes": [list(s) for s in args.shapes]}
    return record_run("flash_speed", args, measure, config)


if __name__ == "__main__":
    main()
