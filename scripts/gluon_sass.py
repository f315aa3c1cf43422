"""Fingerprint the Gluon kernels' sm90a binaries, on any machine (no GPU): for each kernel of
`KERNELS` (or those named), head dim of its `TILES`, causal or not, bf16 and fp16, the SASS's
instruction count and the SHA-1 of its instructions (`compile_for_sm90`). Two trees whose lines
agree run the same code: a refactor that claims to change nothing is checked by comparing the
lines before and after, and a kernel change by which lines move.

    python scripts/gluon_sass.py [--kernels dkdv-paired] [--out before.txt]
    python scripts/gluon_sass.py --compare before.txt          # exit 1 where a line differs
    python scripts/gluon_sass.py --triton-site DIR ...         # with another Triton
    python scripts/gluon_sass.py --gpu-triton-version          # GPU_TRITON, for scripts/setup.sh

The GPU box's Triton (GPU_TRITON, the reference run's) can reject code that this machine's
accepts; with `--triton-site` (a folder holding that Triton, put first on the path:
`GPU_TRITON_SITE`, where scripts/setup.sh installs it) the kernels compile with it instead. A
kernel that does not compile is a line with its error, never a fingerprint. `FINGERPRINTS` holds
the landed kernels' lines under GPU_TRITON: the binaries the reference run measured. A test
holds the tree to it, so that a kernel change comes with its new lines (`--out`) and says that
the measured binaries changed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

DTYPES = ("bfloat16", "float16")
ROOT = Path(__file__).resolve().parents[1]
# the Triton of the GPU box that measured the reference run, where scripts/setup.sh installs it
# beside this machine's, and the landed kernels' fingerprints under it
GPU_TRITON = "3.6.0"
GPU_TRITON_SITE = ROOT / ".triton-gpu"
FINGERPRINTS = ROOT / "docs" / f"gluon-sass-triton-{GPU_TRITON.rsplit('.', 1)[0]}.txt"


def fingerprints(kernels: list[str] | None) -> list[str]:
    """One line per (kernel, d, causal, dtype): its instructions and SHA-1, or its error."""
    import torch

    from cs336_systems.kernels.flash_gluon import KERNELS, TILES, compile_for_sm90

    lines = []
    for kernel in kernels or KERNELS:
        for d in TILES[kernel]:
            for causal in (True, False):
                for dtype in DTYPES:
                    where = f"{kernel} d{d} {'causal' if causal else 'full'} {dtype}"
                    try:
                        usage = compile_for_sm90(kernel, d, causal, dtype=getattr(torch, dtype))
                    except Exception as error:  # noqa: BLE001 - the line says what failed
                        message = str(error).strip().splitlines() or [type(error).__name__]
                        lines.append(f"{where} error: {message[-1]}")
                        continue
                    lines.append(f"{where} {usage['instructions']} {usage['sass_sha1'][:12]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", help="names of KERNELS (default: all)")
    parser.add_argument("--out", type=Path, help="write the lines here too")
    parser.add_argument("--compare", type=Path, help="lines of an earlier run to hold these to")
    parser.add_argument("--triton-site", type=Path,
                        help="a folder holding another Triton to compile with")
    parser.add_argument("--gpu-triton-version", action="store_true",
                        help="print the GPU box's Triton version (GPU_TRITON) and stop")
    args = parser.parse_args(argv)
    if args.gpu_triton_version:
        print(GPU_TRITON)
        return 0
    # Gluon kernels compile, they never interpret: without CUDA the kernels package would turn
    # the interpreter on, and `compile_for_sm90` would then compile each one in a child process
    os.environ.setdefault("TRITON_INTERPRET", "0")
    if args.triton_site:
        if not (args.triton_site / "triton").is_dir():
            parser.error(f"--triton-site {args.triton_site}: no triton package there")
        rest = [*(["--kernels", *args.kernels] if args.kernels else []),
                *(["--out", str(args.out)] if args.out else []),
                *(["--compare", str(args.compare)] if args.compare else [])]
        source = ROOT / "src"
        env = {**os.environ, "TRITON_INTERPRET": "0",
               "PYTHONPATH": os.pathsep.join([str(args.triton_site.resolve()), str(source)])}
        return subprocess.run([sys.executable, __file__, *rest], env=env, check=False).returncode
    lines = fingerprints(args.kernels)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    if args.compare:
        before = {_where(line): line for line in args.compare.read_text().splitlines() if line}
        changed = [f"- {before.get(_where(line), '(not in ' + str(args.compare) + ')')}\n"
                   f"+ {line}" for line in lines if before.get(_where(line)) != line]
        print("\n".join(changed) if changed else "the same SASS for every line")
        return 1 if changed else 0
    return 1 if any(" error: " in line for line in lines) else 0


def _where(line: str) -> str:
    """A line's configuration: kernel, head dim, causal or not, dtype."""
    return " ".join(line.split()[:4])


if __name__ == "__main__":
    sys.exit(main())
