#!/usr/bin/env bash
# Create .venv (reusing the system's PyTorch where there is one, e.g. on a GPU box) and install
# this package with its test dependencies and the SLURM executor plugin. Safe to run again: it
# only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
# An unpinned torch would pull a multi-GB CUDA build; on a machine without PyTorch we take the
# pinned CPU-capable release, and on a GPU box the torch that is already installed is kept.
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
# The resolver makes everything this project imports agree; --no-warn-conflicts drops its
# report on the system's own tools that the newer versions here no longer suit (awscli's
# docutils, say), which matter only to those tools run from inside this venv.
"$py" -m pip install -q --no-warn-conflicts -e ".[test,slurm]"
# The GPU box's Triton (the reference run's, scripts/gluon_sass.py's GPU_TRITON) beside this one,
# in .triton-gpu/: a test compiles the Gluon kernels with it, since code that this machine's
# Triton accepts can fail there, and holds them to the binaries the reference run measured.
# CS336_GPU_TRITON=0 leaves it out (the test then skips and says why), as does a failed download.
gpu_triton=$("$py" scripts/gluon_sass.py --gpu-triton-version)
if [ "${CS336_GPU_TRITON:-1}" != 0 ] && [ ! -d ".triton-gpu/triton-$gpu_triton.dist-info" ] \
    && [ "$("$py" -c 'import triton; print(triton.__version__)')" != "$gpu_triton" ]; then
  rm -rf .triton-gpu
  "$py" -m pip install -q --no-deps --target .triton-gpu "triton==$gpu_triton" \
    || { rm -rf .triton-gpu; echo "note: Triton $gpu_triton not installed in .triton-gpu/"; }
fi
echo "ready: $("$py" -c 'import torch, snakemake; print("torch", torch.__version__, "| snakemake", snakemake.__version__)')"
