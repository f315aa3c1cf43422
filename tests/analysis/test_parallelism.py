"""§7's library (cs336_systems.analysis.parallelism): the formulas against simulations, torch's FLOP
counter, autograd, and device counts worked out by hand."""

import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch

from cs336_systems.analysis import parallelism as par
from cs336_systems.analysis import ring_collectives as ring

# Hand-checkable numbers: B W / C = 10, so a batch-splitting pass allows 1 + 10 = 11 devices;
# F W / C = 10, so tensor parallelism allows 1 + 1.5 * 10 = 16 forward, 1 + 3 * 10 = 31 backward.
HAND = {par.B: 1000, par.D: 7, par.F: 1000, par.C: 1000.0, par.W: 10.0}


def _tensors(n: int, elements: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, elements).astype(np.float64) for _ in range(n)]


# --- collectives ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_the_simulated_ring_all_reduce_sums_exactly_in_the_formulas_time(n):
    tensors = _tensors(n, 4 * n)
    results, sent = ring.simulate_ring_all_reduce(tensors)
    total = np.sum(tensors, axis=0)
    assert all(np.array_equal(r, total) for r in results)
    size = tensors[0].nbytes
    assert len(sent) == 2 * (n - 1)
    assert all(b == size // n for step in sent for b in step)   # a shard per device per step
    w = 3.0
    formula = par.value(par.all_reduce_time(par.S, par.N), {par.S: size, par.N: n, par.W: w})
    assert ring.simulated_time(sent, w) == pytest.approx(formula, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_the_alternate_all_reduce_takes_n_minus_1_whole_tensor_steps(n):
    tensors = _tensors(n, 6)
    results, sent = ring.simulate_alternate_all_reduce(tensors)
    assert all(np.array_equal(r, np.sum(tensors, axis=0)) for r in results)
    size = tensors[0].nbytes
    assert len(sent) == n - 1 and all(b == size for step in sent for b in step)
    formula = par.value(par.alternate_all_reduce_time(par.S, par.N), {par.S: size, par.N: n,
                                                                      par.W: 1.0})
    assert ring.simulated_time(sent, 1.0) == pytest.approx(formula) == (n - 1) * size
    # against the ring: N/2 times the time
    assert par.formula(sp.simplify(par.alternate_all_reduce_time(par.S, par.N)
                                   / par.all_reduce_time(par.S, par.N))) == "N/2"


def test_reduce_scatter_then_all_gather_each_take_n_minus_1_over_n_s_over_w():
    n, tensors = 4, _tensors(4, 8)
    reduced, sent_rs = ring.simulate_reduce_scatter([np.array_split(t, n) for t in tensors])
    expected = np.array_split(np.sum(tensors, axis=0), n)
    for i in range(n):
        assert np.array_equal(reduced[i][(i + 1) % n], expected[(i + 1) % n])
    gathered, sent_ag = ring.simulate_all_gather(reduced)
    assert all(np.array_equal(np.concatenate(g), np.concatenate(expected)) for g in gathered)
    size = tensors[0].nbytes
    for sent, time in ((sent_rs, par.reduce_scatter_time), (sent_ag, par.all_gather_time)):
        assert ring.simulated_time(sent, 1.0) == pytest.approx(
            par.value(time(par.S, par.N), {par.S: size, par.N: n, par.W: 1.0}))


# --- the FFN: FLOPs and the tensor-parallel backward ---------------------------------------

def test_ffn_flops_read_off_the_equations_match_torchs_flop_counter():
    whole = par.ffn_equations()
    assert par.formula(par.equations_flops(whole.forward)) == "6*B*D*F"
    assert par.formula(par.equations_flops(whole.backward)) == "12*B*D*F"
    for rows, d, cols in ((4, 8, 12), (6, 5, 3)):
        forward, backward = par.counted_flops(rows, d, cols)
        shapes = {par.B: rows, par.D: d, par.F: cols}
        assert forward == par.value(par.equations_flops(whole.forward), shapes)
        assert backward == par.value(par.equations_flops(whole.backward), shapes)


@pytest.mark.parametrize("n", [2, 4])
def test_each_strategys_flops_per_device_match_the_counter_on_its_share(n):
    b, d, f = 8, 6, 12
    shapes = {par.B: b, par.D: d, par.F: f, par.N: n}
    shares = {"data parallel": (par.data_parallel(), (b // n, d, f)),
              "FSDP": (par.fsdp(), (b // n, d, f)),
              "tensor parallel": (par.tensor_parallel(), (b, d, f // n))}
    for name, (passes, share) in shares.items():
        counted = par.counted_flops(*share)
        for i, p in enumerate(("forward", "backward")):
            assert par.value(passes[p].flops, shapes) == counted[i], (name, p)
    grid = par.fsdp_tp()
    counted = par.counted_flops(b // n, d, f // 2)
    assert par.value(grid.flops, {**shapes, par.N_FSDP: n, par.N_TP: 2}) == counted[0]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_tensor_parallel_backward_equations_match_autograd_in_float64(n):
    t = par.ffn_tensors(rows=5, d=6, cols=12)
    sharded = par.tensor_parallel_gradients(t, n)
    reference = par.autograd_gradients(t)
    assert set(sharded) == set(reference) == {"Y", "dX", "dW1", "dW2", "dW3"}
    for name, value in reference.items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-12, atol=1e-12, msg=name)


def test_the_tensor_parallel_equations_print_as_pytorch_writes_them():
    eq = par.ffn_equations(cols=par.F / par.N, suffix="_i")
    lines = par.equation_lines(eq.forward + eq.backward)
    assert "H_i = silu(A_i) * V_i" in lines and "dH_i = dY @ W3_i.T" in lines
    assert "dX_i = dA_i @ W1_i.T + dV_i @ W2_i.T" in lines
    assert "dW1_i = X.T @ dA_i" in lines
    # each device's FLOPs are the whole FFN's over N
    assert par.formula(par.equations_flops(eq.backward)) == "12*B*D*F/N"


# --- the strategies -------------------------------------------------------------------------

def _largest_by_search(p: par.Pass, values: dict, limit: int = 200) -> int:
    """The largest N up to `limit` whose communication fits in its compute, by trying each."""
    comm, compute = (sp.lambdify(par.N, e.subs(values)) for e in (p.comm_time, p.compute_time))
    return max(n for n in range(1, limit) if comm(n) <= compute(n) * (1 + 1e-12))


@pytest.mark.parametrize("strategy, pass_name, expected, formula", [
    ("data parallel", "backward", 11, "B*W/C + 1"),
    ("FSDP", "forward", 11, "B*W/C + 1"),
    ("FSDP", "backward", 11, "B*W/C + 1"),
    ("tensor parallel", "forward", 16, "1 + 3*F*W/(2*C)"),
    ("tensor parallel", "backward", 31, "1 + 3*F*W/C"),
])
def test_the_largest_device_counts_on_hand_checkable_numbers(strategy, pass_name, expected,
                                                             formula):
    p = {"data parallel": par.data_parallel(), "FSDP": par.fsdp(),
         "tensor parallel": par.tensor_parallel()}[strategy][pass_name]
    bound = par.break_even(p.comm_time, p.compute_time, par.N)
    assert par.formula(bound) == formula
    assert par.largest_count(bound, HAND) == expected == _largest_by_search(p, HAND)


def test_data_parallel_traffic_is_the_gradient_all_reduce():
    dp = par.data_parallel()
    assert dp["forward"].comm_time == 0
    assert par.formula(dp["backward"].comm_time) == "12*D*F*(N - 1)/(N*W)"
    # FSDP moves 3/2 of it over a step: one more all-gather of the weights
    fsdp = par.fsdp()
    assert sp.simplify((fsdp["forward"].comm_time + fsdp["backward"].comm_time)
                       / dp["backward"].comm_time) == sp.Rational(3, 2)


def _grid_search(grid: par.Grid, time: sp.Expr, limit: int = 40) -> tuple[int, int, int]:
    """(N, -N_TP, N_FSDP) of the largest feasible grid (ties: the smaller N_TP), by trying every
    pair below `limit`."""
    comm, compute = (sp.lambdify((par.N_TP, par.N_FSDP), e.subs(HAND))
                     for e in (time, grid.compute_time))
    return max((t * f, -t, f) for t, f in itertools.product(range(1, limit), repeat=2)
               if comm(t, f) <= compute(t, f) * (1 + 1e-12))


def test_the_2d_grid_overlapped_allows_the_product_of_the_axes_limits():
    grid = par.fsdp_tp()
    n_fsdp = par.largest_count(par.break_even(grid.fsdp_time, grid.compute_time, par.N_FSDP),
                               HAND)
    n_tp = par.largest_count(par.break_even(grid.tp_time, grid.compute_time, par.N_TP), HAND)
    assert (n_tp, n_fsdp) == (16, 11)
    assert _grid_search(grid, grid.overlapped_time) == (176, -16, 11)


def test_the_2d_grid_without_overlap_by_search_and_by_sympy():
    grid = par.fsdp_tp()
    assert par.formula(par.sequential_load(grid)) == (
        "2*C*(N_TP - 1)/(3*F*W) + C*(N_FSDP - 1)/(B*W)")
    n_tp, n_fsdp = par.best_sequential_grid(grid, HAND)
    assert (n_tp * n_fsdp, -n_tp, n_fsdp) == _grid_search(grid, grid.sequential_time)
    # the real optimum: 1/2 + 3FW/(4C) + 3F/(4B) = 0.5 + 7.5 + 0.75
    assert par.value(par.sequential_optimum(grid), HAND) == pytest.approx(8.75)


def test_the_balanced_split_equalises_the_two_collectives():
    grid, n = par.fsdp_tp(), 64
    n_tp = par.value(par.balanced_split(grid), {**HAND, par.N: n})
    values = {**HAND, par.N_TP: n_tp, par.N_FSDP: n / n_tp}
    assert par.value(grid.fsdp_time, values) == pytest.approx(par.value(grid.tp_time, values))
    # for large N it goes as sqrt(3 F N / (2 B))
    lead = par.leading_term(par.balanced_split(grid))
    assert sp.simplify(lead - sp.sqrt(3 * par.F * par.N / (2 * par.B))) == 0
    assert math.isclose(par.value(lead, {**HAND, par.N: n}), math.sqrt(1.5 * 1000 * 64 / 1000))
