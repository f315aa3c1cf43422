import copy
from pathlib import Path

import pytest
import yaml

from cs336_systems.config import ConfigError, resolve_preset, validate
from cs336_systems.model import MODEL_SIZES

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


@pytest.fixture
def config():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_shipped_config_is_valid(config):
    validate(config, SCHEMA)


def test_schema_sizes_are_the_model_sizes():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["$defs"]["size"]["enum"] == list(MODEL_SIZES)


def _error(config) -> str:
    with pytest.raises(ConfigError) as info:
        validate(config, SCHEMA)
    return str(info.value)


def test_unknown_size_names_key_and_allowed_values(config):
    config["presets"]["quick"]["benchmark"]["sizes"] = ["small", "huge"]
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
    config["presets"]["smoke"]["benchmark"][key] = value
    message = _error(config)
    assert f"presets.smoke.benchmark.{key}" in message and str(value) in message


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
    explicit = copy.deepcopy(config)
    explicit["preset"] = "quick"
    name, preset = resolve_preset(explicit, cuda_available=True)
    assert name == "quick" and preset == config["presets"]["quick"]


def test_gpu_preset_on_a_cpu_machine_is_refused_with_the_alternatives(config):
    config["preset"] = "quick"
    with pytest.raises(ConfigError, match="'quick' needs a CUDA GPU .* presets for a CPU: smoke"):
        resolve_preset(config, cuda_available=False)
