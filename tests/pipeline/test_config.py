
import pytest

from cs336_systems.pipeline.config import (
    ConfigError,
    deep_merge,
    resolve_preset,
    validate,
)
from support.checkout import ROOT, project_yaml

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


@pytest.fixture
def config():
    return project_yaml()


def test_shipped_config_is_valid(config):
    validate(config, SCHEMA)


def _error(config) -> str:
    with pytest.raises(ConfigError) as info:
        validate(config, SCHEMA)
    return str(info.value)


def test_unknown_size_names_key_and_allowed_values(config):
    config["presets"]["quick"]["benchmark"]["sizes"] = ["small", "huge"]  # a preset's delta
    message = _error(config)
    assert "presets.quick.benchmark.sizes[1]" in message
    assert "'huge'" in message and "small, medium, large, xl, 2.7b" in message


def test_unknown_preset(config):
    config["preset"] = "fast"
    message = _error(config)
    assert "config key 'preset'" in message and "auto, assignment, quick, smoke" in message


@pytest.mark.parametrize("key, value", [("measure_steps", 0), ("measure_steps", 1),
                                        ("warmup_steps", -1), ("batch_size", 0)])
def test_non_positive_step_counts(config, key, value):
    config["defaults"]["benchmark"][key] = value
    message = _error(config)
    assert f"defaults.benchmark.{key}" in message and str(value) in message


def test_context_longer_than_the_model_supports(config):
    config["presets"]["smoke"]["benchmark"]["context_lengths"] = [16, 512]
    message = _error(config)
    assert "presets.smoke.benchmark" in message and "512" in message and "at most 256" in message


def test_misspelled_key_lists_allowed_keys(config):
    bench = config["presets"]["smoke"]["benchmark"]
    bench["sizez"] = bench.pop("sizes")
    message = _error(config)
    assert "'sizez' was unexpected" in message and "allowed keys:" in message


def test_auto_preset_follows_the_device(config):
    assert resolve_preset(config, cuda_available=True)[0] == "assignment"
    assert resolve_preset(config, cuda_available=False)[0] == "smoke"


def test_a_preset_is_the_defaults_with_its_delta_merged_in(config):
    config["preset"] = "quick"
    _, quick = resolve_preset(config, cuda_available=False)
    delta = config["presets"]["quick"]["benchmark"]
    assert quick["benchmark"]["sizes"] == delta["sizes"]  # a list replaces
    assert quick["benchmark"]["warmup_ablation"]["sizes"] == delta["warmup_ablation"]["sizes"]
    # what the delta leaves out comes from the defaults, nested keys included
    assert quick["benchmark"]["modes"] == config["defaults"]["benchmark"]["modes"]
    assert (quick["benchmark"]["warmup_ablation"]["warmup_steps"]
            == config["defaults"]["benchmark"]["warmup_ablation"]["warmup_steps"])
    config["preset"] = "assignment"
    assert resolve_preset(config)[1] == config["defaults"]


def test_deep_merge_does_not_change_its_inputs():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    delta = {"a": {"c": [3]}, "e": 2}
    assert deep_merge(base, delta) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1} and delta == {"a": {"c": [3]}, "e": 2}


def test_a_gpu_preset_resolves_on_a_cpu_machine(config):
    """Parsing checks no hardware: the jobs of a cuda preset record `skipped` instead."""
    config["preset"] = "quick"
    name, preset = resolve_preset(config, cuda_available=False)
    assert name == "quick" and preset["device"] == "cuda"


def test_cross_checks_see_the_merged_preset(config):
    config["presets"]["smoke"]["distributed"]["ddp"]["batch_size"] = 3  # world_size 2: defaults
    message = _error(config)
    assert "presets.smoke.distributed.ddp.batch_size': 3 does not split evenly" in message


def test_the_fsdp_benchmark_is_cross_checked_like_ddp(config):
    config["presets"]["smoke"]["fsdp"].update(batch_size=3, context_length=4096)
    message = _error(config)
    assert "presets.smoke.fsdp.batch_size': 3 does not split evenly over world_size 2" in message
    assert ("presets.smoke.fsdp': context length 4096 is longer than size 'tiny' supports"
            in message)


def test_two_leaderboard_matrices_of_one_name_are_refused(config):
    matrices = config["defaults"]["leaderboard"]["matrices"]
    matrices[1]["name"] = matrices[0]["name"]
    assert "leaderboard.matrices': two matrices share a name (full, full, proxy, proxy-peers)" in _error(config)


def test_an_integer_key_refuses_a_float(config):
    """JSON Schema counts 2.0 as an integer; this project does not (a batch of 2.0 would reach
    range() and the records' names)."""
    config["defaults"]["benchmark"]["batch_size"] = 2.0
    message = _error(config)
    assert "config key 'defaults.benchmark.batch_size': 2.0 is not of type 'integer'" in message
    config["defaults"]["benchmark"]["batch_size"] = 2
    validate(config, SCHEMA)


def test_command_line_values_are_typed_before_they_are_validated(config):
    """Snakemake reads a nested `--config` with YAML's base loader: every leaf text."""
    from cs336_systems.pipeline.config import typed, with_typed_overrides

    assert typed({"a": {"b": "0", "c": "fast", "d": ["1.5", "true", "null"]}}) == {
        "a": {"b": 0, "c": "fast", "d": [1.5, True, None]}}
    overrides = {"defaults": {"benchmark": {"batch_size": "0"}}}
    with_typed_overrides(config, overrides)
    assert config["defaults"]["benchmark"]["batch_size"] == 0
    assert config["defaults"]["benchmark"]["sizes"]  # the rest of the block stays
    assert "'defaults.benchmark.batch_size': 0 is less than the minimum of 1" in _error(config)
