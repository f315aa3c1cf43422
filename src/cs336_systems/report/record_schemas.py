"""What each kind of record holds, checked when a section's tables read it.

Every section folder has `records.yaml`: for each kind of record its jobs write (the record's
`section` field) the config keys every record of that kind has and the metrics every `ok` one
has, each with its type:

    benchmark:
      config:                   # every record, whatever its status
        size: string
        context_length: integer
      metrics:                  # every `ok` record
        forward_ms: times       # forward_ms_{mean,std,min,max,median} numbers, _samples a list
        peak_gib: number or null
      optional_metrics:         # typed where present (a forward-only run has no backward)
        backward_ms: times

`optional_config` likewise lists config keys that older records of a kind lack.

Types: string, integer (not 2.0), number, boolean, list, object, each `or null` where a record
may hold null there (a peak on a CPU). A kind whose records come in several shapes lists them,
each with `when:` (a config key the record has, or `{key: value}`), the last one possibly
without. `check_record` raises `records.DamagedRecord` naming the file, the key, what was
expected and the command that measures the record again: an `ok` record never reaches a table
with a blank where its section needs a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from cs336_systems.paths import PACKAGE_DIR
from cs336_systems.records import damaged, read_record
from cs336_systems.schema import validator

SCHEMA_FILES = "sections/*/records.yaml"  # under the package folder
# A `times` metric: measure.timing.summarize's statistics of its samples, and the samples.
TIMES_STATISTICS = ("mean", "std", "min", "max", "median")
TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
         "list": "array", "object": "object", "null": "null"}
GROUPS = ("when", "config", "optional_config", "metrics", "optional_metrics")
ARTICLES = {"string": "a string", "integer": "an integer", "number": "a number",
            "boolean": "true or false", "list": "a list", "object": "an object", "null": "null"}


@dataclass(frozen=True)
class Shape:
    """One shape of a kind of record: when it applies, and its JSON Schema."""

    kind: str
    when: Any
    schema: dict
    source: str

    def applies(self, config: dict) -> bool:
        if self.when is None:
            return True
        if isinstance(self.when, str):
            return self.when in config
        return all(config.get(key) == value for key, value in self.when.items())


def schema_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    return sorted(package_dir.glob(SCHEMA_FILES))


def _types(words: str, where: str) -> list[str]:
    types = [w.strip() for w in str(words).split(" or ")]
    if unknown := [t for t in types if t not in TYPES]:
        raise ValueError(f"{where}: unknown type {', '.join(unknown)}; allowed: "
                         f"{', '.join(TYPES)}, 'times', joined by ' or '")
    return [TYPES[t] for t in types]


def _properties(block: dict | None, where: str) -> dict[str, dict]:
    """{key: type words} -> JSON Schema properties; `times` becomes its statistics and samples."""
    properties = {}
    for key, words in (block or {}).items():
        if words == "times":
            for statistic in TIMES_STATISTICS:
                properties[f"{key}_{statistic}"] = {"type": "number"}
            properties[f"{key}_samples"] = {"type": "array"}
        else:
            properties[key] = {"type": _types(words, f"{where}.{key}")}
    return properties


def _shape_schema(shape: dict, where: str) -> dict:
    if unknown := set(shape) - set(GROUPS):
        raise ValueError(f"{where}: unknown {', '.join(sorted(unknown))}; a shape has "
                         f"{', '.join(GROUPS)}")
    config, optional_config, metrics, optional_metrics = (
        _properties(shape.get(group), f"{where}.{group}") for group in GROUPS[1:])
    metrics_any = {"type": "object", "properties": {**metrics, **optional_metrics}}
    return {
        "type": "object",
        "properties": {"config": {"type": "object", "required": sorted(config),
                                  "properties": {**config, **optional_config}},
                       "metrics": metrics_any},
        # an ok record holds every metric its section reads
        "if": {"properties": {"status": {"const": "ok"}}},
        "then": {"properties": {"metrics": {**metrics_any, "required": sorted(metrics)}}},
    }


@cache
def shapes(package_dir: Path = PACKAGE_DIR) -> dict[str, tuple[Shape, ...]]:
    """Every kind of record -> its shapes, from every section's records.yaml."""
    found: dict[str, tuple[Shape, ...]] = {}
    for path in schema_files(package_dir):
        source = str(path.relative_to(package_dir.parent))
        for kind, entry in (yaml.safe_load(path.read_text()) or {}).items():
            if kind in found:
                raise ValueError(f"{source}: records of kind {kind!r} are described twice "
                                 f"(also in {found[kind][0].source})")
            entries = entry if isinstance(entry, list) else [entry]
            found[kind] = tuple(Shape(kind, e.get("when"), _shape_schema(e, f"{source}:{kind}"),
                                      source) for e in entries)
    return found


def _expected(schema: dict) -> str:
    types = schema.get("type", [])
    return " or ".join(ARTICLES[word] for t in ([types] if isinstance(types, str) else types)
                       for word, json_type in TYPES.items() if json_type == t)


def check_record(record: dict, path: str | Path) -> None:
    """Raise `DamagedRecord` where `record` (read from `path`) lacks a key its kind's schema
    requires, or holds a value of another type."""
    kind = record["section"]
    kinds = shapes()
    if kind not in kinds:
        raise damaged(path, f"no section describes records of kind {kind!r} (each "
                            f"sections/<section>/records.yaml names the kinds its jobs write)")
    shape = next((s for s in kinds[kind] if s.applies(record["config"])), None)
    if shape is None:
        raise damaged(path, f"its config matches no shape of a {kind!r} record in "
                            f"{kinds[kind][0].source}")
    errors = sorted(validator(shape.schema).iter_errors(record), key=lambda e: list(e.path))
    if not errors:
        return
    error = errors[0]
    key = ".".join(map(str, error.absolute_path))
    if error.validator == "required":
        missing = next(k for k in error.validator_value if k not in error.instance)
        part = key or "record"
        expected = _expected(error.schema["properties"][missing])
        what = "an ok" if part == "metrics" else "a"
        raise damaged(path, f"{part}.{missing} is missing; {what} {kind!r} record has "
                            f"{expected} there")
    if error.validator == "type":
        value = "null" if error.instance is None else repr(error.instance)
        raise damaged(path, f"{key} is {value}; a {kind!r} record has "
                            f"{_expected(error.schema)} there")
    raise damaged(path, f"{key or 'the record'}: {error.message}")


def read_checked(path: str | Path) -> dict:
    """The record at `path`, read (`records.read_record`) and checked against its kind."""
    record = read_record(path)
    check_record(record, path)
    return record


def check_record_files(paths) -> int:
    """Check every record in `paths`; how many there were."""
    count = 0
    for path in paths:
        read_checked(path)
        count += 1
    return count
