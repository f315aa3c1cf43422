"""Analysing parallelism strategies (§7, 2026): one SwiGLU FFN on N devices, derived in sympy.

The assignment's setting: N devices, every pair linked, each sending W bytes/s and computing
C FLOP/s; fp16 weights and activations (`VALUE_BYTES` = 2 a value); one feed-forward network

    A = X @ W1,  V = X @ W2        (B, F)      X: (B, D);  W1, W2: (D, F)
    H = silu(A) * V                (B, F)      * is elementwise
    Y = H @ W3                     (B, D)      W3: (F, D)

with B the tokens of the whole batch the devices share (the rows of X), D = d_model and
F = d_ff. A matmul (m, k) @ (k, n) costs 2 m k n FLOPs; the elementwise work (silu and the
products, O(B F)) is left out. Ring collectives of S bytes over n devices: all-gather and
reduce-scatter take (n-1)/n * S / W, all-reduce twice that.

A pass is compute-bound while its communication, overlapped with its compute, takes no longer
than the compute: T_comm <= T_compute. "The largest N" of a strategy is the largest device
count for which that holds: the root of T_comm = T_compute, solved by sympy, rounded down.

The parts, in order: the symbols; the ring collectives' times (`ring_collectives` simulates
them over n devices, counting the bytes each device sends per step); the FFN's equations as
sympy matrix expressions (their FLOPs read off the shapes; the same expressions evaluated on
tensors, which checks the tensor-parallel backward against autograd); the strategies (data
parallel, FSDP, tensor parallel, FSDP x TP), each a set of sympy expressions; and the integer
device counts they give for numbers (C, W, B and a model's D and F).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy as sp
import torch
from sympy.matrices.expressions import (
    HadamardProduct,
    MatAdd,
    MatMul,
    MatrixExpr,
    MatrixSymbol,
    Transpose,
)
from sympy.matrices.expressions.applyfunc import ElementwiseApplyFunction
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter
from torch.utils.flop_counter import FlopCounterMode

B = sp.Symbol("B", positive=True)            # tokens in the batch the devices share (rows of X)
D = sp.Symbol("D", positive=True)            # d_model
F = sp.Symbol("F", positive=True)            # d_ff
N = sp.Symbol("N", positive=True)            # devices
N_TP = sp.Symbol("N_TP", positive=True)      # devices of the tensor-parallel axis (2D grid)
N_FSDP = sp.Symbol("N_FSDP", positive=True)  # devices of the FSDP axis (2D grid)
W = sp.Symbol("W", positive=True)            # bytes/s each device sends (egress)
C = sp.Symbol("C", positive=True)            # FLOP/s of each device
S = sp.Symbol("S", positive=True)            # bytes of the tensor a collective moves

VALUE_BYTES = 2                              # fp16 weights, activations and gradients
FFN_WEIGHTS = 3                              # W1, W2 and W3, D x F values each


def all_gather_time(size, n):
    """Ring all-gather of `size` bytes in all over `n` devices: n-1 steps, in each every device
    sends one shard of size/n to the next, all links at once: (n-1)/n * size / W."""
    return (n - 1) / n * size / W


def reduce_scatter_time(size, n):
    """Ring reduce-scatter: the all-gather's steps run backwards, adding: (n-1)/n * size / W."""
    return (n - 1) / n * size / W


def all_reduce_time(size, n):
    """Ring all-reduce = reduce-scatter, then all-gather: 2 (n-1)/n * size / W."""
    return reduce_scatter_time(size, n) + all_gather_time(size, n)


def alternate_all_reduce_time(size, n):
    """alternate_ring_all_reduce: every device forwards whole tensors around the ring. In step t
    (1 to n-1) device i sends x[(i-t+1) mod n], receives x[(i-t) mod n] and adds it, so each of
    the n-1 steps moves all `size` bytes over every link: (n-1) size / W. Against the ring
    all-reduce's 2 (n-1)/n size / W that is n/2 times longer: it sends n/2 times the bytes,
    because nothing is split into shards."""
    return (n - 1) * size / W


silu = sp.Function("silu")
silu_prime = sp.Function("silu'")        # d silu(a) / da = sigmoid(a) (1 + a (1 - sigmoid(a)))
ELEMENTWISE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "silu'": lambda a: torch.sigmoid(a) * (1 + a * (1 - torch.sigmoid(a))),
}

Equation = tuple[MatrixSymbol, MatrixExpr]   # lhs = rhs; the lhs names a new matrix


@dataclass(frozen=True)
class FFNEquations:
    """One device's FFN on `rows` tokens with `cols` of the F hidden columns (a column shard of
    W1 and W2, the matching row shard of W3), forward and backward. With rows = B and cols = F it
    is the whole FFN; tensor parallelism gives each device cols = F / N and sums Y and dX over the
    devices (an all-reduce each)."""
    forward: tuple[Equation, ...]            # from X, W1, W2, W3
    backward: tuple[Equation, ...]           # from those, the forward's results and dY


def ffn_equations(rows=B, cols=F, suffix: str = "") -> FFNEquations:
    """The forward and backward of one device's FFN (`suffix` names its shards, "_i").

    Backward, from dY = dL/dY (rows, D), by the chain rule through Y = H @ W3, H = silu(A) * V,
    A = X @ W1 and V = X @ W2:
        dH = dY @ W3.T            dW3 = H.T @ dY
        dA = dH * V * silu'(A)    dV = dH * silu(A)
        dW1 = X.T @ dA            dW2 = X.T @ dV
        dX = dA @ W1.T + dV @ W2.T
    """
    def m(name, r, c):
        return MatrixSymbol(name + suffix, r, c)

    X = MatrixSymbol("X", rows, D)                            # every shard sees all of X's columns
    W1, W2, W3 = m("W1", D, cols), m("W2", D, cols), m("W3", cols, D)
    A, V, H, Y = m("A", rows, cols), m("V", rows, cols), m("H", rows, cols), m("Y", rows, D)
    dY = MatrixSymbol("dY", rows, D)                          # whole on every device, as Y is
    dH, dA, dV, dX = m("dH", rows, cols), m("dA", rows, cols), m("dV", rows, cols), m("dX", rows, D)
    dW1, dW2, dW3 = m("dW1", D, cols), m("dW2", D, cols), m("dW3", cols, D)
    forward = ((A, X * W1), (V, X * W2),
               (H, HadamardProduct(A.applyfunc(silu), V)),
               (Y, H * W3))
    backward = ((dH, dY * W3.T), (dW3, H.T * dY),
                (dA, HadamardProduct(dH, V, A.applyfunc(silu_prime))),
                (dV, HadamardProduct(dH, A.applyfunc(silu))),
                (dW1, X.T * dA), (dW2, X.T * dV),
                (dX, dA * W1.T + dV * W2.T))
    return FFNEquations(forward, backward)


def matmul_flops(expr: MatrixExpr) -> sp.Expr:
    """FLOPs of the matmuls in `expr`, read off its operands' shapes: 2 m k n for each product of
    an (m, k) and a (k, n) matrix, left to right; elementwise work counts nothing."""
    if isinstance(expr, MatMul):
        matrices = [a for a in expr.args if isinstance(a, MatrixExpr)]
        flops, (m, k) = sum(matmul_flops(a) for a in matrices), matrices[0].shape
        for right in matrices[1:]:
            flops += 2 * m * k * right.shape[1]
            k = right.shape[1]
        return flops
    if isinstance(expr, ElementwiseApplyFunction):
        return matmul_flops(expr.expr)
    if isinstance(expr, (MatAdd, HadamardProduct, Transpose)):
        return sum((matmul_flops(a) for a in expr.args if isinstance(a, MatrixExpr)), sp.S.Zero)
    return sp.S.Zero


def equations_flops(equations: Sequence[Equation]) -> sp.Expr:
    return sp.simplify(sum((matmul_flops(rhs) for _, rhs in equations), sp.S.Zero))


def evaluate(equations: Sequence[Equation],
             values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run `equations` in order on tensors: `values` names the inputs (by symbol name); returns
    them with every left-hand side added. The same expressions the writeup prints are the ones
    computed here."""
    values = dict(values)
    for lhs, rhs in equations:
        values[lhs.name] = _evaluate(rhs, values)
    return values


def _evaluate(expr, values: dict[str, torch.Tensor]) -> torch.Tensor:
    if isinstance(expr, MatrixSymbol):
        return values[expr.name]
    if isinstance(expr, Transpose):
        return _evaluate(expr.arg, values).T
    if isinstance(expr, ElementwiseApplyFunction):
        return ELEMENTWISE[_function_name(expr)](_evaluate(expr.expr, values))
    combine = {MatMul: operator.matmul, HadamardProduct: operator.mul, MatAdd: operator.add}
    for kind, op in combine.items():
        if isinstance(expr, kind):
            return functools.reduce(op, (_evaluate(a, values) for a in expr.args))
    raise TypeError(f"cannot evaluate {type(expr).__name__}: {expr}")


def _function_name(expr: ElementwiseApplyFunction) -> str:
    return expr.function.expr.func.__name__   # Lambda(d, silu(d)) -> "silu"


class _TorchStylePrinter(StrPrinter):
    """Matrix expressions as PyTorch writes them: @ for matmul, * elementwise, .T transposed."""

    def _print_MatMul(self, expr):
        return " @ ".join(self.parenthesize(a, PRECEDENCE["Mul"]) for a in expr.args)

    def _print_HadamardProduct(self, expr):
        return " * ".join(self.parenthesize(a, PRECEDENCE["Mul"]) for a in expr.args)

    def _print_Transpose(self, expr):
        return f"{self.parenthesize(expr.arg, PRECEDENCE['Atom'], strict=True)}.T"

    def _print_ElementwiseApplyFunction(self, expr):
        return f"{_function_name(expr)}({self._print(expr.expr)})"


def formula(expr) -> str:
    """An expression as the writeup shows it: sympy's own str for scalars, PyTorch's notation
    for matrices."""
    return _TorchStylePrinter().doprint(expr)


def equation_lines(equations: Sequence[Equation]) -> list[str]:
    return [f"{formula(lhs)} = {formula(rhs)}" for lhs, rhs in equations]


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """The FFN written the ordinary way: autograd differentiates this one."""
    return (torch.nn.functional.silu(x @ w1) * (x @ w2)) @ w3


def ffn_tensors(rows: int, d: int, cols: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Random X (rows, d), W1, W2 (d, cols), W3 (cols, d) and dY (rows, d)."""
    return {"X": torch.randn(rows, d, dtype=dtype), "W1": torch.randn(d, cols, dtype=dtype),
            "W2": torch.randn(d, cols, dtype=dtype), "W3": torch.randn(cols, d, dtype=dtype),
            "dY": torch.randn(rows, d, dtype=dtype)}


def counted_flops(rows: int, d: int, cols: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of the FFN on these shapes as torch's FlopCounterMode counts
    the matmuls autograd runs; X requires grad too, as a layer inside a model does."""
    t = {k: v.requires_grad_(k != "dY") for k, v in ffn_tensors(rows, d, cols).items()}
    with FlopCounterMode(display=False) as forward:
        y = ffn(t["X"], t["W1"], t["W2"], t["W3"])
    with FlopCounterMode(display=False) as backward:
        y.backward(t["dY"])
    return forward.get_total_flops(), backward.get_total_flops()


def tensor_parallel_gradients(t: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """The FFN's gradients from n tensor-parallel devices, each running the backward equations
    (`ffn_equations(suffix="_i")`) on a column shard of W1 and W2 and the row shard of W3; dX is
    the sum of the devices' dX_i (the backward's all-reduce), the weight gradients stay sharded
    and are concatenated here only to compare with the unsharded FFN's."""
    equations = ffn_equations(cols=F / N, suffix="_i")
    per_device = []
    for cols in torch.arange(t["W1"].shape[1]).chunk(n):
        shard = {"X": t["X"], "dY": t["dY"], "W1_i": t["W1"][:, cols], "W2_i": t["W2"][:, cols],
                 "W3_i": t["W3"][cols, :]}
        per_device.append(evaluate(equations.forward + equations.backward, shard))
    return {"Y": sum(d["Y_i"] for d in per_device), "dX": sum(d["dX_i"] for d in per_device),
            "dW1": torch.cat([d["dW1_i"] for d in per_device], dim=1),
            "dW2": torch.cat([d["dW2_i"] for d in per_device], dim=1),
            "dW3": torch.cat([d["dW3_i"] for d in per_device], dim=0)}


def autograd_gradients(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Y and the gradients of the unsharded FFN, by autograd."""
    leaves = {k: t[k].detach().clone().requires_grad_() for k in ("X", "W1", "W2", "W3")}
    y = ffn(leaves["X"], leaves["W1"], leaves["W2"], leaves["W3"])
    y.backward(t["dY"])
    return {"Y": y.detach(), **{f"d{k}": v.grad for k, v in leaves.items()}}


@dataclass(frozen=True)
class Pass:
    """One device's forward or backward pass: its matmul FLOPs and its communication time (the
    collectives it must finish, overlapped with the compute)."""
    flops: sp.Expr
    comm_time: sp.Expr

    @property
    def compute_time(self) -> sp.Expr:
        return self.flops / C


def weight_bytes():
    """W1, W2 and W3 in fp16 (their gradients are as large)."""
    return FFN_WEIGHTS * D * F * VALUE_BYTES


def activation_bytes(rows):
    """One (rows, D) fp16 activation: Y, or dX."""
    return rows * D * VALUE_BYTES


@functools.cache
def data_parallel() -> dict[str, Pass]:
    """data_parallel_calcs: every device holds all weights and B/N of the batch; the backward
    all-reduces the weight gradients."""
    eq = ffn_equations(rows=B / N)
    return {"forward": Pass(equations_flops(eq.forward), sp.S.Zero),
            "backward": Pass(equations_flops(eq.backward), all_reduce_time(weight_bytes(), N))}


@functools.cache
def fsdp() -> dict[str, Pass]:
    """fsdp_calcs: every device stores 1/N of the weights and takes B/N of the batch; the
    forward all-gathers the weights, the backward gathers them again and reduce-scatters their
    gradients."""
    eq = ffn_equations(rows=B / N)
    gather = all_gather_time(weight_bytes(), N)
    return {"forward": Pass(equations_flops(eq.forward), gather),
            "backward": Pass(equations_flops(eq.backward),
                             gather + reduce_scatter_time(weight_bytes(), N))}


@functools.cache
def tensor_parallel() -> dict[str, Pass]:
    """tp_calcs: W1 and W2 split by columns, W3 by rows, over N devices that all see the whole
    batch; the forward all-reduces the devices' partial Y, the backward their partial dX."""
    eq = ffn_equations(rows=B, cols=F / N, suffix="_i")
    reduce = all_reduce_time(activation_bytes(B), N)
    return {"forward": Pass(equations_flops(eq.forward), reduce),
            "backward": Pass(equations_flops(eq.backward), reduce)}


def tensor_parallel_collectives() -> dict[str, str]:
    """What each pass's all-reduce sums over the devices, as a line beside the equations."""
    eq = ffn_equations(rows=B, cols=F / N, suffix="_i")
    y, dx = eq.forward[-1][0], eq.backward[-1][0]
    return {"forward_collective": f"Y = all_reduce({y.name}) over the N devices",
            "backward_collective": f"dX = all_reduce({dx.name}) over the N devices"}


@dataclass(frozen=True)
class Grid:
    """fsdp_tp_calcs: the forward on a 2D grid N = N_TP x N_FSDP. The batch is split N_FSDP ways;
    within an FSDP group, tensor parallelism splits F N_TP ways; each device stores 1/N of the
    weights and all-gathers its TP shard over the FSDP axis."""
    flops: sp.Expr
    fsdp_time: sp.Expr      # all-gather of the TP shard of the weights over N_FSDP devices
    tp_time: sp.Expr        # all-reduce of the group's Y, (B / N_FSDP, D), over N_TP devices

    @property
    def compute_time(self) -> sp.Expr:
        return self.flops / C

    @property
    def overlapped_time(self) -> sp.Expr:
        """The two axes' collectives run at once: the slower sets the time."""
        return sp.Max(self.fsdp_time, self.tp_time)

    @property
    def sequential_time(self) -> sp.Expr:
        """The two axes cannot overlap: one after the other."""
        return self.fsdp_time + self.tp_time


@functools.cache
def fsdp_tp() -> Grid:
    eq = ffn_equations(rows=B / N_FSDP, cols=F / N_TP, suffix="_i")
    return Grid(flops=equations_flops(eq.forward),
                fsdp_time=all_gather_time(weight_bytes() / N_TP, N_FSDP),
                tp_time=all_reduce_time(activation_bytes(B / N_FSDP), N_TP))


@functools.cache
def break_even(comm_time: sp.Expr, compute_time: sp.Expr, n: sp.Symbol) -> sp.Expr:
    """The device count `n` at which communication takes as long as compute: beyond it, the
    pass is communication-bound (every strategy's comm / compute grows with n)."""
    roots = [r for r in sp.solve(sp.Eq(comm_time, compute_time), n) if r.is_positive is not False]
    if len(roots) != 1:
        raise ValueError(f"expected one positive root of {comm_time} = {compute_time} in {n}, "
                         f"got {roots}")
    return sp.expand(roots[0])


def balanced_split(grid: Grid) -> sp.Expr:
    """For a given N, the N_TP at which the FSDP and TP collectives take equal time: it minimises
    their maximum, since one falls with N_TP and the other rises (N_FSDP = N / N_TP). The
    equation is a quadratic in N_TP whose roots multiply to -3FN/(2B) < 0, so exactly one root
    is positive for every positive B, F, N: that one."""
    equal = sp.Eq(grid.fsdp_time, grid.tp_time).subs(N_FSDP, N / N_TP)
    sample = {B: 1, D: 1, F: 1, N: 1}
    (root,) = [r for r in sp.solve(equal, N_TP) if r.subs(sample) > 0]
    return sp.simplify(root)


def leading_term(expr: sp.Expr, power=sp.Rational(1, 2)) -> sp.Expr:
    """expr's leading term in N as N grows, when that goes as N**power."""
    return sp.simplify(sp.limit(expr / N**power, N, sp.oo)) * N**power


def sequential_load(grid: Grid) -> sp.Expr:
    """Without overlap, (fsdp + tp time) / compute time, one term per axis: the forward is
    compute-bound while this is at most 1."""
    return (sp.simplify(grid.fsdp_time / grid.compute_time)
            + sp.simplify(grid.tp_time / grid.compute_time))


@functools.cache
def sequential_boundary(grid: Grid) -> sp.Expr:
    """Without overlap, the largest N_FSDP (as a function of N_TP) for which fsdp + tp time
    stays within compute: sequential_time = compute_time solved for N_FSDP."""
    return break_even(grid.sequential_time, grid.compute_time, N_FSDP)


def sequential_optimum(grid: Grid) -> sp.Expr:
    """The real N_TP that maximises N = N_TP * N_FSDP on the non-overlapped boundary (the
    product is a downward parabola in N_TP)."""
    product = N_TP * sequential_boundary(grid)
    (root,) = sp.solve(sp.diff(product, N_TP), N_TP)
    return sp.simplify(root)


def overlapped_largest(grid: Grid) -> sp.Expr:
    """With the axes overlapped, each axis's condition involves only its own count, so the
    largest N = N_TP * N_FSDP (real) is the product of the two axes' limits: the closed-form
    bound N <= this."""
    return sp.factor(break_even(grid.fsdp_time, grid.compute_time, N_FSDP)
                     * break_even(grid.tp_time, grid.compute_time, N_TP))


def sequential_largest(grid: Grid) -> sp.Expr:
    """Without overlap, the largest real N on the boundary: N_TP * N_FSDP at the optimum
    N_TP (`sequential_optimum`), the closed-form bound N <= this."""
    best = sequential_optimum(grid)
    return sp.factor(sp.simplify(best * sequential_boundary(grid).subs(N_TP, best)))


def value(expr: sp.Expr, values: dict[sp.Symbol, float]) -> float:
    return float(expr.subs(values))


def largest_count(bound: sp.Expr, values: dict[sp.Symbol, float]) -> int:
    """The largest whole device count not above `bound` (at least 1: one device never talks)."""
    return max(1, math.floor(value(bound, values) + 1e-9))


def best_sequential_grid(grid: Grid, values: dict[sp.Symbol, float]) -> tuple[int, int]:
    """The whole (N_TP, N_FSDP) with the largest product whose forward stays compute-bound with
    the two axes' collectives one after the other: for each N_TP up to the TP axis's own limit,
    the largest N_FSDP on the boundary. Ties go to the smaller N_TP."""
    tp_limit = largest_count(break_even(grid.tp_time, grid.compute_time, N_TP), values)
    boundary = sequential_boundary(grid)
    best = (1, 1)
    for n_tp in range(1, tp_limit + 1):
        n_fsdp = largest_count(boundary.subs(N_TP, n_tp), values)
        if n_tp * n_fsdp > best[0] * best[1]:
            best = (n_tp, n_fsdp)
    return best
