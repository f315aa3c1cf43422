#!/usr/bin/env bash
# Run Snakemake targets of the quick preset in CHECKOUT under the start-up probe, from an empty
# results/, and summarise where each job's time went (issue 23's before and after).
#   bash scripts/startup_probe/run.sh CHECKOUT OUTDIR TARGET...
# Needs snakemake importable by python3; the probe's lines go to OUTDIR/probe.jsonl. Triton's and
# Inductor's caches start empty (fresh folders), as on a new machine.
set -euo pipefail
checkout=$1 out=$2
shift 2
probe=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
caches=$(mktemp -d)
(cd "$checkout" && rm -rf results .snakemake &&
  TRITON_CACHE_DIR="$caches/triton" TORCHINDUCTOR_CACHE_DIR="$caches/inductor" \
  STARTUP_PROBE_LOG="$out/probe.jsonl" PYTHONPATH="$probe:$PWD/src:${PYTHONPATH:-}" \
  python3 -m snakemake "$@" --cores 1 --config preset=quick >"$out/snakemake.log" 2>&1) || true
python3 "$probe/summarize.py" "$out/probe.jsonl" --json "$out/summary.json"
