"""Render report/writeup.md from the section tables and figures.

    python -m cs336_systems.report.writeup --preset smoke --results-dir results/smoke \
        --benchmark-table results/smoke/tables/benchmark.csv \
        --benchmark-scaling-figure ... --benchmark-warmup-figure ... \
        --flash-table ... --flash-leaderboard-table ... --flash-latency-figure ... \
        --flash-speedup-figure ... --output report/writeup.md
"""

from __future__ import annotations

import argparse

import pandas as pd

from cs336_systems.records import git_commit, write_text_atomic
from cs336_systems.report.render import render_template
from cs336_systems.report.sections import benchmark, distributed, flash
from cs336_systems.report.tables import read_table


def _distinct(tables: list[pd.DataFrame], column: str) -> str:
    values = sorted({str(v) for t in tables if column in t for v in t[column].dropna().unique()})
    return ", ".join(values) if values else "n/a"


def header_rows(preset: str, tables: list[pd.DataFrame]) -> str:
    rows = [
        ("preset", preset),
        ("device", _distinct(tables, "env_device")),
        ("GPU", _distinct(tables, "env_gpu")),
        ("torch", _distinct(tables, "env_torch")),
        ("Triton", _distinct(tables, "env_triton")),
        ("code commit of the measurements", _distinct(tables, "env_git")),
        ("commit that rendered this writeup", git_commit()),
    ]
    return "\n".join(f"| {k} | {v} |" for k, v in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--benchmark-table", required=True)
    parser.add_argument("--benchmark-scaling-figure", required=True)
    parser.add_argument("--benchmark-warmup-figure", required=True)
    parser.add_argument("--flash-table", required=True)
    parser.add_argument("--flash-leaderboard-table", required=True)
    parser.add_argument("--flash-latency-figure", required=True)
    parser.add_argument("--flash-speedup-figure", required=True)
    for name in ("allreduce-table", "ddp-table", "sharded-table", "accounting-table",
                 "allreduce-figure", "ddp-figure"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)

    benchmark_table = read_table(args.benchmark_table)
    flash_table = read_table(args.flash_table)
    flash_board = read_table(args.flash_leaderboard_table)
    sections = [
        benchmark.render(benchmark_table, args.benchmark_scaling_figure,
                         args.benchmark_warmup_figure, args.output),
        flash.render(flash_table, flash_board, args.flash_latency_figure,
                     args.flash_speedup_figure, args.output),
    ]
    allreduce, ddp = read_table(args.allreduce_table), read_table(args.ddp_table)
    sharded, accounting = read_table(args.sharded_table), read_table(args.accounting_table)
    sections.append(distributed.render(allreduce, ddp, sharded, accounting, args.allreduce_figure,
                                       args.ddp_figure, args.output))
    tables = [benchmark_table, flash_table, flash_board, allreduce, ddp, sharded]
    text = render_template("writeup.md", results_dir=args.results_dir,
                           header_rows=header_rows(args.preset, tables),
                           sections="\n\n".join(sections))
    write_text_atomic(args.output, text)


if __name__ == "__main__":
    main()
