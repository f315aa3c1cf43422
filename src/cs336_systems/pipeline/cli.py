"""What every section CLI shares: argument types, so bad values fail with a usage message, the
options every CLI takes, and its last step (`record_run`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from cs336_systems.pipeline.records import run_and_record


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def section_parser(doc: str) -> argparse.ArgumentParser:
    """A section CLI's parser: its module docstring as the help, and the options every CLI
    takes (`add_common_arguments`)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    return parser


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="path of the JSON record to write")


def parsed_config(args: argparse.Namespace) -> dict:
    """The configuration a record holds: every parsed option but where the record goes and the
    device it ran on (the record's environment says that)."""
    return {k: v for k, v in vars(args).items() if k not in ("output", "device")}


def record_run(section: str, args: argparse.Namespace, measure: Callable[[dict, Any], dict],
               config: dict | None = None) -> dict:
    """A one-process CLI's last step: `measure(config, device)` for the parsed options (or the
    `config` made from them), written as one record of `section`."""
    config = parsed_config(args) if config is None else config
    return run_and_record(section, config, args.output, lambda device: measure(config, device),
                          args.device)
