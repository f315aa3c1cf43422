"""The mixed-precision study's parts, one per job: fp16/bf16 accumulation, the toy model's
dtypes under autocast, layer norm's (the CLI: `run_study`)."""

from __future__ import annotations

import torch

from cs336_systems.analysis import mixed_precision as mp
from cs336_systems.lm.precision import PRECISIONS

PARTS: dict[str, tuple[str, ...]] = {  # each part's options: its record's config
    "accumulation": ("steps", "increment"),
    "toy-model": ("precision", "batch_size", "in_features", "out_features"),
    "layernorm": ("rows", "width", "offsets", "std_min", "std_max", "eps"),
}


def accumulation(config: dict, device: torch.device) -> dict:
    return {"loops": [mp.accumulation_loop(acc, value, cast_up, config["steps"],
                                           config["increment"], device)
                      for acc, value, cast_up in mp.ACCUMULATION_LOOPS]}


def toy_model(config: dict, device: torch.device) -> dict:
    return mp.toy_model_dtypes(config["precision"], device, config["batch_size"],
                               config["in_features"], config["out_features"], config["seed"])


def layernorm(config: dict, device: torch.device) -> dict:
    methods, inputs = [], []
    for offset in config["offsets"]:
        x = mp.activations(config["rows"], config["width"], offset, config["std_min"],
                           config["std_max"], device, config["seed"])
        for precision in PRECISIONS:
            inputs.append({"offset": offset, **mp.rounded_input(x, precision)})
            methods += [{"offset": offset, **row}
                        for row in mp.layernorm_errors(x, precision, config["eps"])]
    return {"methods": methods, "inputs": inputs}


MEASURE = {"accumulation": accumulation, "toy-model": toy_model, "layernorm": layernorm}
