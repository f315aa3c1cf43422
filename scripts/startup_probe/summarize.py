"""Summarise a STARTUP_PROBE_LOG (see sitecustomize.py beside this): per job, where its time went
from Snakemake's dispatch to its exit, and the totals.

    python scripts/startup_probe/summarize.py probe.jsonl [--json out.json]

A job is a process that ran an experiment's measure function. Its parts, in seconds:
dispatch (Snakemake wrote the job script -> the first process of the job started), start-up
(the job's first process started -> measuring began, CUDA initialisation left out),
cuda_init, measuring, teardown (measuring ended -> the job's last process exited), and the
gap before the next job (Snakemake's own bookkeeping between jobs, with --cores 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def jobs(lines: list[dict]) -> list[dict]:
    by_output: dict[str, list[dict]] = defaultdict(list)
    for event in lines:
        if event.get("output"):
            by_output[event["output"]].append(event)
    rows = []
    for output, events in by_output.items():
        measured = [e for e in events if e.get("measure") and e["measure"][1]]
        if not measured:
            continue
        m = measured[0]
        first = min(events, key=lambda e: e["created"])
        dispatched = next((e["script_written"] for e in events if e.get("script_written")),
                          first["created"])
        cuda = m.get("cuda_init") or [m["measure"][0], m["measure"][0]]
        cuda_s = cuda[1] - cuda[0]
        inside = m["measure"][0] <= cuda[0] <= m["measure"][1]
        measure_s = m["measure"][1] - m["measure"][0] - (cuda_s if inside else 0.0)
        startup_s = m["measure"][0] - first["created"] - (0.0 if inside else cuda_s)
        torch_end = m["imports"].get("torch")
        rows.append({
            "output": output, "dispatched": dispatched,
            "exit": max(e["exit"] for e in events),
            "dispatch_s": first["created"] - dispatched,
            "interpreter_s": first["site"] - first["created"],
            "torch_import_s": (torch_end - m["site"]) if torch_end else None,
            "startup_s": startup_s, "cuda_init_s": cuda_s, "measure_s": measure_s,
            "teardown_s": max(e["exit"] for e in events) - m["measure"][1],
        })
    rows.sort(key=lambda r: r["dispatched"])
    for row, following in zip(rows, rows[1:]):
        row["gap_to_next_s"] = following["dispatched"] - row["exit"]
    return rows


def summary(rows: list[dict]) -> dict:
    def total(key):
        return sum(r[key] for r in rows if r.get(key) is not None)

    def median(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    # start-up as issue 23 counts it: everything of a job's wall time but measuring
    overhead = [r["dispatch_s"] + r["startup_s"] + r["cuda_init_s"] + r["teardown_s"]
                for r in rows]
    wall = rows[-1]["exit"] - rows[0]["dispatched"] if rows else 0.0
    return {"jobs": len(rows), "wall_s": wall,
            "startup_total_s": sum(overhead), "measure_total_s": total("measure_s"),
            "startup_median_s": statistics.median(overhead) if overhead else None,
            "between_jobs_total_s": total("gap_to_next_s"),
            **{f"{k}_median": median(k) for k in
               ("dispatch_s", "interpreter_s", "torch_import_s", "startup_s", "cuda_init_s",
                "measure_s", "teardown_s", "gap_to_next_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--json", help="write the rows and the summary here")
    args = parser.parse_args()
    with open(args.log) as f:
        rows = jobs([json.loads(line) for line in f if line.strip()])
    result = summary(rows)
    for key, value in result.items():
        print(f"{key:28s} {value if not isinstance(value, float) else round(value, 3)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": result, "jobs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
