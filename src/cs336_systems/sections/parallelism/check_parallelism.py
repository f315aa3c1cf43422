"""§7 (2026), analysing parallelism strategies: the checks behind the derived formulas.

    python -m cs336_systems.sections.parallelism.check_parallelism --ring-devices 2 3 4 8 \
        --chunk-elements 5 --batch 8 --d-model 16 --d-ff 24 --devices 2 4 --output r.json

No device work (CPU, seconds). Three checks of `cs336_systems.analysis.parallelism`, each against
something computed independently of its formulas:
- collectives: the ring reduce-scatter, all-gather and all-reduce and the alternate all-reduce
  simulated step by step over N devices (one tensor of N x chunk-elements float64 values each):
  the steps, the bytes each device sends, the time at W = 1 byte/s against the formula's, and
  whether every device ends with the right values;
- FLOPs: torch's FlopCounterMode on one device's share of the FFN (forward, then autograd's
  backward) for each strategy, against the strategy's sympy FLOPs;
- the tensor-parallel backward equations run on N simulated devices, against autograd on the
  unsharded FFN, in float64.
"""

from __future__ import annotations

import argparse

from cs336_systems.pipeline.records import run_and_record
from cs336_systems.sections.parallelism.checks import measure


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring-devices", type=int, nargs="+", default=[2, 3, 4, 8])
    parser.add_argument("--chunk-elements", type=int, default=5,
                        help="values per ring chunk: each device's tensor is N x this")
    parser.add_argument("--batch", type=int, default=8, help="B, rows of X")
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--d-ff", type=int, default=24)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4],
                        help="device counts of the FLOP and tensor-parallel checks")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    config = {k: v for k, v in vars(args).items() if k != "output"}
    return run_and_record("parallelism", config, args.output, lambda device: measure(config),
                          device="cpu")


if __name__ == "__main__":
    main()

