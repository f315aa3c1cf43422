"""Validate the workflow config and resolve the active preset.

`config.yaml` holds `defaults` (a complete experiment matrix) and named `presets`, each a delta
deep-merged over the defaults: a mapping merges key by key, anything else (a list, a number)
replaces. The schema (`workflow/schemas/config.schema.yaml`) checks types, ranges and allowed
values of the defaults and of each preset's delta where it is written; the checks that span keys
(a context longer than a model size supports) run here on each merged preset. Every error names
the config key, the value and what is allowed. Nothing here looks at the hardware except
`preset: auto`, which picks `assignment` on a CUDA machine and `smoke` elsewhere.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cs336_systems.lm.model import context_length_problem
from cs336_systems.schema import validator

AUTO = "auto"


class ConfigError(ValueError):
    pass


def _key(prefix: str, path) -> str:
    parts = [prefix] if prefix else []
    for part in path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".") or "<top level>"


def _describe(error: jsonschema.ValidationError, prefix: str = "") -> str:
    key = _key(prefix, error.absolute_path)
    if error.validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"config key '{key}': {error.instance!r} is not allowed; allowed values: {allowed}"
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return f"config key '{key}': {error.message}; allowed keys: {allowed}"
    return f"config key '{key}': {error.message}"


def _errors(validator: jsonschema.Validator, instance: Any, prefix: str = "") -> list[str]:
    return [_describe(e, prefix)
            for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.path))]


def _without_required(schema: Any) -> Any:
    """The schema with every `required` dropped: what a preset's delta must satisfy."""
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


def typed(value: Any) -> Any:
    """A `--config` value with its strings typed as config.yaml would type them: Snakemake reads
    `--config 'defaults={benchmark: {batch_size: 0}}'` with YAML's base loader, every leaf a
    string, so that a number given on the command line would reach the schema as text."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, str):
        loaded = yaml.safe_load(value) if value.strip() else value
        return loaded if isinstance(loaded, (int, float, bool)) or loaded is None else value
    return value


def with_typed_overrides(config: dict[str, Any], overrides: dict[str, Any] | None) -> None:
    """Lay the `--config` `overrides`, typed, over `config` in place (Snakemake has merged them
    already, untyped)."""
    if overrides:
        merged = deep_merge(config, typed(overrides))
        config.clear()
        config.update(merged)


def deep_merge(base: dict, delta: dict) -> dict:
    """`base` with `delta` laid over it: mappings merge recursively, other values replace."""
    merged = copy.deepcopy(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def merged_presets(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every preset as the defaults with its delta merged in."""
    return {name: deep_merge(config["defaults"], delta or {})
            for name, delta in config["presets"].items()}


def validate(config: dict[str, Any], schema_path: str | Path) -> None:
    """Raise ConfigError listing every schema violation and cross-key inconsistency."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    problems = _errors(validator(schema), config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    preset_schema = {**schema["$defs"]["preset"], "$defs": schema["$defs"]}
    delta_validator = validator(_without_required(preset_schema))
    full_validator = validator(preset_schema)
    for name, delta in config["presets"].items():
        problems += _errors(delta_validator, delta or {}, f"presets.{name}")
    if not problems:
        for name, preset in merged_presets(config).items():
            problems += _errors(full_validator, preset, f"presets.{name}")
    if not problems:
        problems = _cross_checks(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _model_blocks(block: Any, key: str = "") -> Iterator[tuple[str, list[str], list[int]]]:
    """Every block of a preset that builds the LM: (its config key, its sizes, its context
    lengths), found by shape (a mapping with `size`/`sizes` and `context_length`/
    `context_lengths`), so a new section's block is checked without being named here."""
    if not isinstance(block, dict):
        return
    sizes = block.get("sizes", [block["size"]] if "size" in block else None)
    contexts = block.get("context_lengths",
                         [block["context_length"]] if "context_length" in block else None)
    if sizes and contexts:
        yield key, sizes, contexts
    for name, value in block.items():
        yield from _model_blocks(value, f"{key}.{name}" if key else name)


def _cross_checks(config: dict[str, Any]) -> list[str]:
    problems = []
    preset = config.get("preset")
    if preset != AUTO and preset not in config["presets"]:
        allowed = ", ".join([AUTO, *config["presets"]])
        problems.append(f"config key 'preset': {preset!r} is not a preset; allowed: {allowed}")
    for name, preset_config in merged_presets(config).items():
        for key, sizes, contexts in _model_blocks(preset_config):
            for size in sizes:
                for context in contexts:
                    if problem := context_length_problem(size, context):
                        problems.append(f"config key 'presets.{name}.{key}': {problem}")
        bench = preset_config["benchmark"]
        if bench["warmup_steps"] < 1:
            problems.append(
                f"config key 'presets.{name}.benchmark.warmup_steps': the compiled model runs "
                "at the benchmark's warm-up, which must be at least 1 so that compilation is "
                "not timed")
        dist = preset_config["distributed"]
        training = {"distributed.ddp": dist["ddp"],
                    "distributed.sharded_optimizer": dist["sharded_optimizer"],
                    "fsdp": preset_config["fsdp"]}
        for part, c in training.items():
            if c["batch_size"] % c["world_size"]:
                problems.append(
                    f"config key 'presets.{name}.{part}.batch_size': "
                    f"{c['batch_size']} does not split evenly over world_size {c['world_size']}")
        names = [m["name"] for m in preset_config["leaderboard"]["matrices"]]
        if len(set(names)) < len(names):
            problems.append(f"config key 'presets.{name}.leaderboard.matrices': two matrices "
                            f"share a name ({', '.join(names)}); each names its records' folder")
        layernorm = preset_config["mixed_precision"]["layernorm"]
        if layernorm["std_min"] > layernorm["std_max"]:
            problems.append(
                f"config key 'presets.{name}.mixed_precision.layernorm': std_min "
                f"{layernorm['std_min']} is larger than std_max {layernorm['std_max']}")
    return problems


def resolve_preset(config: dict[str, Any], cuda_available: bool | None = None
                   ) -> tuple[str, dict[str, Any]]:
    """The active preset's name and merged settings; `auto` is `assignment` on CUDA, else
    `smoke`. A GPU preset resolves on any machine: its jobs record `skipped` without CUDA."""
    name = config["preset"]
    if name == AUTO:
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        name = "assignment" if cuda_available else "smoke"
    if name not in config["presets"]:
        raise ConfigError(f"config key 'preset': {name!r} is not a preset; allowed: "
                          f"{', '.join([AUTO, *config['presets']])}")
    return name, merged_presets(config)[name]
