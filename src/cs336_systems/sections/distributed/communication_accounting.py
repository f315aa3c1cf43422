"""communication_accounting (§4.6): the XXL model's memory and compute-bound batch, computed.

    python -m cs336_systems.sections.distributed.communication_accounting --output r.json

No device work: the record holds the inputs (the assignment's constants) as config and the
answers as metrics; see `cs336_systems.analysis.communication` for the model behind them.
"""

from __future__ import annotations

import argparse

from cs336_systems.analysis.communication import XXLConfig, answers, config_dict
from cs336_systems.pipeline.records import run_and_record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    config = XXLConfig()
    return run_and_record("communication_accounting", config_dict(config), args.output,
                          lambda device: answers(config), device="cpu")


if __name__ == "__main__":
    main()
