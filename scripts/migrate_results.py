"""Bring a results folder written before the vocabulary was made one up to the current names,
in place; safe to run twice.

    python scripts/migrate_results.py results/assignment [results/quick ...]
    snakemake --touch report/writeup.md      # once: take the renamed parameters as measured

What changed, so that each idea has one name across config.yaml, the CLIs and the records:
- the flash section's records: `dtype` is `precision`, as everywhere else;
- the attention and all-reduce records: `warmup` and `iterations` are `warmup_steps` and
  `measure_steps`, as in every other timing job;
- the attention choice is spelled with lm.attention's registry names: the training runs
  `ours-fa2-*` are `ours-flash-triton-*`, the leaderboard variants `ours-but-cudnn*` are
  `ours-but-sdpa-cudnn*`. Their records, logs and sidecar files move to the new names.

The measurements are untouched. Tables, facts and figures are rebuilt from the records by the
next run. Without `--touch`, Snakemake would run the renamed jobs again, since their parameters
changed (the `params` rerun trigger).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# record section -> {old config key: new}
RENAMED_KEYS = {
    "flash": {"dtype": "precision"},
    "flash_speed": {"dtype": "precision"},
    "flash_kernels": {"dtype": "precision"},
    "attention": {"warmup": "warmup_steps", "iterations": "measure_steps"},
    "allreduce": {"warmup": "warmup_steps", "iterations": "measure_steps"},
}
# a part of a run's or variant's name: old -> new (in config values and in file names)
RENAMED_NAMES = {"ours-fa2-": "ours-flash-triton-", "ours-but-cudnn": "ours-but-sdpa-cudnn"}
NAMED_KEYS = ("run", "variant")  # the config keys holding a training run or leaderboard variant


def renamed(name: str) -> str:
    for old, new in RENAMED_NAMES.items():
        name = name.replace(old, new)
    return name


def migrate_record(record: dict) -> bool:
    """Rename `record`'s config keys and names in place; whether anything changed."""
    config = record.get("config")
    if not isinstance(config, dict):
        return False
    keys = RENAMED_KEYS.get(record.get("section"), {})
    migrated = {keys.get(key, key): renamed(value) if key in NAMED_KEYS and
                isinstance(value, str) else value for key, value in config.items()}
    if migrated == config and list(migrated) == list(config):
        return False
    record["config"] = migrated  # the same order of keys, as the record was written
    return True


def migrate(folder: Path) -> tuple[int, int]:
    """(records rewritten, files renamed) under `folder`."""
    rewritten = moved = 0
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and "status" in record and migrate_record(record):
            path.write_text(json.dumps(record, indent=1) + "\n")  # as records.py writes
            rewritten += 1
    for path in sorted(folder.rglob("*"), reverse=True):  # files before their folders
        if path.is_file() and renamed(path.name) != path.name:
            path.rename(path.with_name(renamed(path.name)))
            moved += 1
    return rewritten, moved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="results/<preset> folders")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
        rewritten, moved = migrate(folder)
        print(f"{folder}: {rewritten} records rewritten, {moved} files renamed")


if __name__ == "__main__":
    main()
