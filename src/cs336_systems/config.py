"""Validate the workflow config and pick the active preset.

The schema (`workflow/schemas/config.schema.yaml`) checks types, ranges and allowed values; the
checks that span keys (a context longer than a model size supports) live here. Every error
names the config key, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cs336_systems.model import MODEL_SIZES

AUTO = "auto"


class ConfigError(ValueError):
    pass


def _key(path) -> str:
    parts = []
    for part in path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".") or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    key = _key(error.absolute_path)
    if error.validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"config key '{key}': {error.instance!r} is not allowed; allowed values: {allowed}"
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return f"config key '{key}': {error.message}; allowed keys: {allowed}"
    return f"config key '{key}': {error.message}"


def validate(config: dict[str, Any], schema_path: str | Path) -> None:
    """Raise ConfigError listing every schema violation and cross-key inconsistency."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    problems = [_describe(e) for e in sorted(validator.iter_errors(config), key=lambda e: e.path)]
    if not problems:
        problems = _cross_checks(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _cross_checks(config: dict[str, Any]) -> list[str]:
    problems = []
    preset = config.get("preset")
    if preset != AUTO and preset not in config["presets"]:
        allowed = ", ".join([AUTO, *config["presets"]])
        problems.append(f"config key 'preset': {preset!r} is not a preset; allowed: {allowed}")
    for name, preset_config in config["presets"].items():
        bench = preset_config.get("benchmark")
        if bench:
            sizes = set(bench["sizes"]) | set(bench["warmup_ablation"]["sizes"])
            contexts = set(bench["context_lengths"]) | {bench["warmup_ablation"]["context_length"]}
            for size in sorted(sizes):
                longest = MODEL_SIZES[size].max_context_length
                for context in sorted(c for c in contexts if c > longest):
                    problems.append(
                        f"config key 'presets.{name}.benchmark': context length {context} is "
                        f"longer than size {size!r} supports (at most {longest})")
        dist = preset_config.get("distributed")
        if dist:
            for part in ("ddp", "sharded_optimizer"):
                c = dist[part]
                longest = MODEL_SIZES[c["size"]].max_context_length
                if c["context_length"] > longest:
                    problems.append(
                        f"config key 'presets.{name}.distributed.{part}.context_length': "
                        f"{c['context_length']} is longer than size {c['size']!r} supports "
                        f"(at most {longest})")
                if c["batch_size"] % c["world_size"]:
                    problems.append(
                        f"config key 'presets.{name}.distributed.{part}.batch_size': "
                        f"{c['batch_size']} does not split evenly over world_size {c['world_size']}")
    return problems


def resolve_preset(config: dict[str, Any], cuda_available: bool | None = None
                   ) -> tuple[str, dict[str, Any]]:
    """The active preset's name and settings; `auto` is `assignment` on CUDA, else `smoke`."""
    name = config["preset"]
    if name == AUTO:
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        name = "assignment" if cuda_available else "smoke"
    if name not in config["presets"]:
        raise ConfigError(f"config key 'preset': {name!r} is not a preset; allowed: "
                          f"{', '.join([AUTO, *config['presets']])}")
    preset = config["presets"][name]
    if preset["requires_cuda"]:
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            cpu_presets = [n for n, p in config["presets"].items() if not p["requires_cuda"]]
            raise ConfigError(f"config key 'preset': {name!r} needs a CUDA GPU and this machine "
                              f"has none; presets for a CPU: {', '.join(cpu_presets)}")
    return name, preset
