"""The residuals records read into frames: each saved tensor by kind (an activation, a weight,
a statistic), each configuration's totals, each operation's saves."""

from __future__ import annotations

import pandas as pd
import torch

from cs336_systems.lm.model import MODEL_SIZES
from cs336_systems.records import read_record
from cs336_systems.report import tables

MIB = 2**20

KINDS = ("(B, h, T, T)", "(B, T, d_ff)", "(B, T, d_model)", "(T, T)", "(T, d_head)", "(B, T)",
         "other")
KIND_NOTES = {"(B, h, T, T)": "attention probabilities", "(B, T, d_ff)": "SwiGLU width",
              "(B, T, d_model)": "one residual-stream activation", "(T, T)": "causal mask",
              "(T, d_head)": "RoPE cos or sin rows", "(B, T)": "one number per token",
              "other": "anything else"}
CONFIG = ["target", "size", "d_model", "num_heads", "batch_size", "context_length", "variant",
          "precision"]


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def tensor_kinds(config: dict) -> dict[str, int]:
    """Element count of each tensor kind at a record's shape."""
    b, t, d = config["batch_size"], config["context_length"], config["d_model"]
    kinds = {"(B, T, d_model)": b * t * d, "(B, T)": b * t}
    if config["target"] == "block":
        h = config["num_heads"]
        kinds.update({"(B, T, d_ff)": b * t * MODEL_SIZES[config["size"]].d_ff,
                      "(B, h, T, T)": b * h * t * t, "(T, T)": t * t,
                      "(T, d_head)": t * (d // h)})
    return kinds


def kind_of(storage: dict, kinds: dict[str, int]) -> str:
    """The kind whose element count the storage has; several, joined, where shapes collide."""
    numel = storage["bytes"] // itemsize(storage["dtype"])
    names = [k for k in KINDS if kinds.get(k) == numel]
    return " or ".join(names) if names else "other"


def read(paths: list[str]) -> list[dict]:
    """Records with, for an `ok` one, each storage's kind."""
    records = []
    for path in paths:
        record = read_record(path)
        if record["status"] == "ok":
            kinds = tensor_kinds(record["config"])
            for s in record["metrics"]["storages"]:
                s["tensor_kind"] = kind_of(s, kinds)
        records.append(record)
    return records


def summary_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: what it saved, against the analytic model."""
    rows = []
    for r in records:
        m, c = r["metrics"], r["config"]
        row = {**{k: c.get(k) for k in CONFIG}, "status": r["status"],
               "message": r.get("message", "")}
        if r["status"] == "ok":
            activations = [s for s in m["storages"] if s["kind"] == "activation" and s["counted"]]
            row.update({
                "saved_count": m["saved_count"], "saved_bytes": m["saved_bytes"],
                "saved_mib": m["saved_bytes"] / MIB,
                "full_size_count": sum(s["tensor_kind"] == "(B, T, d_model)"
                                       for s in activations),
                "analytic_saved_bytes": m["analytic_saved_bytes"],
                "saved_agrees": m["saved_agrees"], "saved_tensors": m["saved_tensors"],
                "parameter_storages": m["parameter_storages"],
                "unhooked_bytes": m["unhooked_bytes"],
                "gradient_bytes": m["gradient_bytes"],
                "analytic_gradient_bytes": m["analytic_gradient_bytes"],
                "gradient_agrees": m["gradient_agrees"],
                "forward_peak_gib": m["forward_peak_gib"],
                "held_after_forward_bytes": m["held_after_forward_bytes"],
                "output_bytes": m["output_bytes"], "method": m["method"]})
        row.update({f"env_{k}": r["env"].get(k) for k in tables.ENV_COLUMNS})
        rows.append(row)
    return tables.ensure_columns(pd.DataFrame(rows, columns=list(rows[0]) if rows else CONFIG), [
        "saved_count", "saved_bytes", "saved_mib", "full_size_count", "analytic_saved_bytes",
        "saved_agrees", "gradient_bytes", "analytic_gradient_bytes", "gradient_agrees",
        "forward_peak_gib", "held_after_forward_bytes", "output_bytes", "message"])


def operations_frame(records: list[dict]) -> pd.DataFrame:
    """Every operation of every `ok` record, largest first within a record, with its rank."""
    rows = []
    for r in records:
        if r["status"] != "ok":
            continue
        for rank, op in enumerate(r["metrics"]["operations"], 1):
            rows.append({**{k: r["config"].get(k) for k in CONFIG}, "rank": rank,
                         "operation": op["operation"], "module": op["module"],
                         "where": op["where"], "code": op["code"], "label": op["label"],
                         "storages": op["storages"], "bytes": op["bytes"],
                         "mib": op["bytes"] / MIB, "share": op["share"],
                         "shapes": "; ".join("x".join(map(str, s)) or "()"
                                             for s in op["shapes"])})
    return pd.DataFrame(rows, columns=[*CONFIG, "rank", "operation", "module", "where", "code",
                                       "label", "storages", "bytes", "mib", "share", "shapes"])


def by_kind(record: dict) -> dict[str, dict]:
    """Activation storages of a record by tensor kind: count, MiB and the operations."""
    out: dict[str, dict] = {}
    ops = {}
    for s in record["metrics"]["storages"]:
        if s["kind"] != "activation" or not s["counted"]:
            continue
        entry = out.setdefault(s["tensor_kind"], {"count": 0, "mib": 0.0, "ops": []})
        entry["count"] += 1
        entry["mib"] += s["bytes"] / MIB
        module = s.get("site_module") or ""
        ops.setdefault(s["tensor_kind"], []).append(f"{module} {s['op']}".strip())
    for kind, names in ops.items():
        out[kind]["ops"] = sorted(set(names), key=names.index)
    return out
