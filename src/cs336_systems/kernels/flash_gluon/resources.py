"""What ptxas allots each kernel's configuration for sm90a, compiled on any machine (no GPU
needed): registers, spilled bytes, shared memory (`compile_for_sm90`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.experimental.gluon import language as gl

from cs336_systems.kernels.checks import triton_interpreting
from cs336_systems.kernels.flash_gluon.common import GL_DTYPES, _block_rows, head_split
from cs336_systems.kernels.flash_gluon.host import (
    _ACCUMULATOR_LAYOUT, _constants, _dq_columns, _shared_layout,
)
from cs336_systems.kernels.flash_gluon.tiles import (
    KERNELS, TILES, Tiles, KERNEL_FUNCTIONS, _O_BY_TMA, _SPLIT_D_KERNELS,
)


def compile_for_sm90(kernel: str, d: int, is_causal: bool, tiles: Tiles | None = None,
                     dtype: torch.dtype = torch.bfloat16) -> dict:
    """Compile one of `KERNELS` for sm90a here (no GPU needed): its registers a thread, bytes
    spilled to local memory, bytes of shared memory and whether ptxas serialized its wgmmas,
    from the cubin, and its SASS's instruction count and fingerprint (`sass_sha1`). Where this
    process runs Triton's interpreter (a CPU machine: `kernels` turns it on), in a child process
    without it: Gluon kernels compile, they do not interpret."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; allowed: {', '.join(KERNELS)}")
    tiles = tiles or TILES[kernel][d]
    if not triton_interpreting():
        return _resource_usage(kernel, d, is_causal, tiles, dtype)
    call = (f"import json, torch; from {__name__} import Tiles, _resource_usage; print(json."
            f"dumps(_resource_usage({kernel!r}, {d}, {is_causal}, {tiles!r}, {dtype})))")
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "0"})
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Gluon {kernel} kernel for sm90a failed:\n"
                           f"{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def _signature(kernel: str, d: int, tiles: Tiles, dtype: torch.dtype) -> dict:
    """The kernel's argument types as the compiler reads them (TMA descriptors with their block
    and shared layout)."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    main, rest = head_split(d)

    def descriptor(block_rows, cols=main):
        layout = _shared_layout(block_rows, cols, GL_DTYPES[dtype])
        return f"tensordesc<{name}[{block_rows}, {cols}],{layout!r}>"

    def rests(*block_rows):     # the rest columns' descriptors, constexpr None without them
        names = ("q_rest", "k_rest", "v_rest", "do_rest")
        return {n: descriptor(r, rest) if rest else "constexpr" for n, r in zip(names, block_rows)}

    if kernel == "delta":
        return {"o_ptr": f"*{name}", "do_ptr": f"*{name}", "delta_ptr": "*fp32", "seq": "i32"}
    q_rows, kv_rows = tiles.block_m, tiles.block_n      # query tiles, key tiles, every kernel
    tensors = {"q_desc": descriptor(q_rows), "k_desc": descriptor(kv_rows),
               "v_desc": descriptor(kv_rows)}
    split = kernel in _SPLIT_D_KERNELS
    if kernel in _O_BY_TMA:
        tensors["o_desc"] = descriptor(q_rows)
    if kernel.startswith("forward"):
        return {**tensors, **(rests(q_rows, kv_rows, kv_rows) if split else {}),
                "o_ptr": f"*{name}", "lse_ptr": "*fp32", "seq": "i32", "qk_scale": "fp32"}
    tensors["do_desc"] = descriptor(q_rows)
    if split:
        tensors.update(rests(q_rows, kv_rows, kv_rows, q_rows))
    if kernel.startswith("dkdv"):   # dQ: the split one's unused, the atomic one's fp32 tiles
        if kernel == "dkdv":
            dq = f"*{name}"
        elif kernel == "dkdv-atomic":
            dq = f"tensordesc<fp32[{q_rows}, {d}],{_shared_layout(q_rows, d, gl.float32)!r}>"
        else:       # a warpgroup's part of the accumulator (`_dq_accumulator`)
            rows = _block_rows(q_rows, _dq_columns(kernel, d))
            dq = f"tensordesc<fp32[{rows}, 32],{_ACCUMULATOR_LAYOUT!r}>"
        pointers = {"dq_desc": dq, "dk_ptr": f"*{name}", "dv_ptr": f"*{name}"}
    else:
        pointers = {"dq_ptr": f"*{name}", "o_ptr": f"*{name}", "do_ptr": f"*{name}"}
    return {**tensors, **pointers, "lse_ptr": "*fp32", "delta_ptr": "*fp32", "seq": "i32",
            "qk_scale": "fp32", "sm_scale": "fp32"}


def _resource_usage(kernel: str, d: int, is_causal: bool, tiles: Tiles,
                    dtype: torch.dtype) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = KERNEL_FUNCTIONS[kernel]
    arguments = _signature(kernel, d, tiles, dtype)
    constants = {**_constants(kernel, d, is_causal, tiles), "num_warps": tiles.num_warps,
                 **{name: None for name, kind in arguments.items() if kind == "constexpr"}}
    kinds = {**arguments, **dict.fromkeys(constants, "constexpr")}
    signature = {name: kinds[name] for name in fn.arg_names}     # in the kernel's order
    # as the JIT specializes a launch: pointers 16-byte aligned (torch's allocations are) and
    # the sequence length a multiple of 16 (every length the benchmarks time)
    divisible = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
                 for name, kind in signature.items() if kind.startswith("*") or name == "seq"}
    compiled = triton.compile(GluonASTSource(fn, signature, constants, divisible),
                              target=GPUTarget("cuda", 90, 32), options=tiles.launch_options())
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    try:
        usage, sass = (subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-res-usage", "-sass"))
    finally:
        os.unlink(f.name)
    # spilled registers live on the thread's stack (the driver's local size, Triton's n_spills
    # times 4), or in local memory
    fields = {name: int(value) for name, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    # ptxas serializes a kernel's wgmmas where it cannot keep them in flight (its C7512 note,
    # which Triton does not show: "insufficient register resources"): then every HGMMA ends
    # its own group (gsb0) and is waited for at once, the products in flight lost
    products = re.findall(r"HGMMA\.[^;]*;", sass)
    # the instructions without their addresses and encodings: two builds with the same
    # fingerprint run the same code (scripts/gluon_sass.py compares them across changes)
    instructions = [re.sub(r"\s*/\*[0-9a-fx]+\*/", "", line).strip()
                    for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    return {"registers": fields["REG"], "spilled_bytes": fields["STACK"] + fields["LOCAL"],
            "shared_bytes": compiled.metadata.shared,
            "serialized_wgmma": bool(products) and all("gsb0" in p for p in products),
            "instructions": len(instructions),
            "sass_sha1": hashlib.sha1("\n".join(instructions).encode()).hexdigest()}
