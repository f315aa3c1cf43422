"""Does Triton's warp specialization or TMA make a FlashAttention-2 forward faster on Hopper?

    python scripts/probe_flash_hopper.py 16x16384x128 16x16384x64 [--json out.json]

A probe, not a kernel of this project: a causal bf16 forward written with TMA tensor
descriptors (made on the device, as Triton's fused-attention tutorial does on Hopper) and its
key loop under `tl.range(..., warp_specialize=...)`, timed beside our forward
(`kernels/flash_triton.py`) and SDPA's cuDNN backend in one process, over 128-row query tiles,
64 or 128 keys, 4 or 8 warps, 2 or 3 stages, with and without warp specialization. A shape is
heads x seq x d (d a power of two; seq a multiple of 128). A configuration that fails to compile
is printed with the compiler's first line. `kernels/flash_triton.py` says what it measured.
"""
import argparse
import itertools
import json
import math
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.kernels import flash_triton as ft
from cs336_systems.kernels.launch import direct

# descriptors made on the device need global scratch memory for themselves
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                             device="cuda"))


@triton.jit
def _tiles(acc, m_i, l_i, q, dk, dv, base, q_rows, lo, hi, qk_scale, BLOCK_N: tl.constexpr,
           BAND: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = dk.load([base + start_n, 0])
        s = tl.dot(q, k.T)
        if BAND:
            cols = start_n + tl.arange(0, BLOCK_N)
            s = tl.where(q_rows[:, None] >= cols[None, :], s, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = dv.load([base + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def fwd_ws(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N_CTX, HEADS, qk_scale, D: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    rows = HEADS * N_CTX
    dq = tl.make_tensor_descriptor(q_ptr, [rows, D], [D, 1], [BLOCK_M, D])
    dk = tl.make_tensor_descriptor(k_ptr, [rows, D], [D, 1], [BLOCK_N, D])
    dv = tl.make_tensor_descriptor(v_ptr, [rows, D], [D, 1], [BLOCK_N, D])
    do = tl.make_tensor_descriptor(o_ptr, [rows, D], [D, 1], [BLOCK_M, D])
    base = head * N_CTX
    q_start = tile * BLOCK_M
    q_rows = q_start + tl.arange(0, BLOCK_M)
    q = dq.load([base + q_start, 0])
    m_i = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    acc, m_i, l_i = _tiles(acc, m_i, l_i, q, dk, dv, base, q_rows, 0, q_start, qk_scale,
                           BLOCK_N, False, WS)
    acc, m_i, l_i = _tiles(acc, m_i, l_i, q, dk, dv, base, q_rows, q_start, q_start + BLOCK_M,
                           qk_scale, BLOCK_N, True, WS)
    acc = acc / l_i[:, None]
    tl.store(lse_ptr + base + q_rows, (m_i + tl.math.log2(l_i)) * 0.6931471805599453)
    do.store([base + q_start, 0], acc.to(q.dtype))


def run_ws(q, k, v, bm, bn, warps, stages, ws):
    heads, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((heads, n), device=q.device, dtype=torch.float32)
    fwd_ws[(n // bm, heads)](q, k, v, o, lse, n, heads, 1.4426950408889634 / math.sqrt(d), D=d,
                             BLOCK_M=bm, BLOCK_N=bn, WS=ws, num_warps=warps, num_stages=stages)
    return o, lse


def cudnn_forward(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]


def probe(spec: str) -> list[dict]:
    heads, n, d = (int(x) for x in spec.split("x"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = cudnn_forward(q, k, v)
    cudnn = do_bench(partial(cudnn_forward, q, k, v))
    ours = do_bench(partial(ft._flash_fwd, q, k, v, True, "tf32", wrap=direct))
    rows = [{"shape": spec, "cudnn_ms": cudnn, "ours_ms": ours}]
    print(json.dumps(rows[-1]), flush=True)
    for tiles in itertools.product([128], [64, 128], [4, 8], [2, 3], [False, True]):
        run = partial(run_ws, q, k, v, *tiles)
        row = {"shape": spec, "tiles": list(tiles[:4]), "ws": tiles[4]}
        try:
            o, _ = run()
            err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            ms = do_bench(run)
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile
            row["failed"] = str(exc).splitlines()[0][:160]
        else:
            row.update(ms=ms, vs_cudnn=ms / cudnn, vs_ours=ms / ours, err=err)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="+", help="HEADSxSEQxD")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [row for spec in args.shapes for row in probe(spec)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
