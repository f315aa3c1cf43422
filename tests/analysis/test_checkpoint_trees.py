"""gradient_checkpointing: the simulator against hand-computed cases, the dynamic programme
against brute force, the live-bytes stand-in against known allocations, the strategies on real
blocks against the simulator, and the experiment CLIs."""

import json
import math

import pytest
import torch

from cs336_systems.analysis import checkpoint_trees as ckpt
from cs336_systems.analysis.checkpoint_trees import BLOCK, Checkpoint, Cost
from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.model import MODEL_SIZES, RotaryEmbedding, TransformerBlock
from cs336_systems.measure.memory import PEAK_SOURCES, LiveBytes, peak_window
from cs336_systems.sections.checkpointing import nested
from cs336_systems.sections.checkpointing import nested_checkpointing as nested_cli
from cs336_systems.sections.checkpointing import time_checkpointing as cli

A, S = 7, 3  # units that tell A apart from s in a sum


# --- strategies and the simulator ------------------------------------------------------------

def test_strategies_have_the_expected_shape():
    assert ckpt.one_level(5, 2) == (Checkpoint((BLOCK, BLOCK)),) * 2 + (Checkpoint((BLOCK,)),)
    assert ckpt.bisection(4) == (Checkpoint((Checkpoint((BLOCK,)),) * 2),) * 2
    assert ckpt.left_nested(3) == (Checkpoint((Checkpoint((Checkpoint((BLOCK,)), BLOCK)),
                                               BLOCK)),)
    assert ckpt.notation(ckpt.one_level(5, 2)) == "C(b×2)×2,C(b)"
    for name, (_, make) in ckpt.STRATEGIES.items():
        for n in (1, 2, 5, 9):
            assert ckpt.length(make(n)) == n, name


@pytest.mark.parametrize("strategy, early_stop, peak, compute", [
    # one plain block: x, A and the output alive, the loss's gradient arrives (A + 3s), then
    # the input's gradient while A, x and the output's gradient are alive (A + 3s)
    ((BLOCK,), True, A + 3 * S, 1),
    # two plain blocks: at the loss, x0, A1, x1, A2, x2 and the gradient: 2A + 4s
    ((BLOCK, BLOCK), True, 2 * A + 4 * S, 2),
    # one checkpointed block: forward keeps x only; backward recomputes A (the early stop skips
    # its output) and allocates x's gradient: A + 3s, one recomputation
    ((Checkpoint((BLOCK,)),), True, A + 3 * S, 2),
    # without early stop the recomputed output is allocated too: x, g, A, output = A + 3s
    ((Checkpoint((BLOCK,)),), False, A + 3 * S, 2),
    # C(C(b),b): forward 2; the outer recomputes C(b) (1, keeping nothing) and b (1); the
    # inner recomputes b (1): 5. Peak in b2's backward: x0 (kept by both checkpoints), x1, A,
    # the gradients in and out: A + 4s
    (ckpt.left_nested(2), True, A + 4 * S, 5),
    # C(b),C(b): the second's recompute while the first keeps x0: x0, x1, g, A (early stop)
    # then x1's gradient: A + 4s; compute 2 + 1 + 1
    (ckpt.one_level(2, 1), True, A + 4 * S, 4),
    # C(b,b) without early stop: the recomputation holds x0, A1, x1, A2, x2 and g: 2A + 4s;
    # with it, x2 is never made, but b2's backward still holds 2A + 4s
    (ckpt.one_level(2, 2), False, 2 * A + 4 * S, 4),
    (ckpt.one_level(2, 2), True, 2 * A + 4 * S, 4),
])
def test_simulator_matches_hand_computed_cases(strategy, early_stop, peak, compute):
    assert ckpt.simulate(strategy, A, S, early_stop) == Cost(peak, compute)


def test_early_stop_skips_a_trailing_nested_checkpoint():
    # C(C(b),C(b)): the outer recomputation stops once the second inner checkpoint has its
    # input back, so that inner block runs once less than without early stop
    strategy = (Checkpoint((Checkpoint((BLOCK,)), Checkpoint((BLOCK,)))),)
    assert ckpt.simulate(strategy, A, S, early_stop=True).compute == 2 + 1 + 1 + 1
    assert ckpt.simulate(strategy, A, S, early_stop=False).compute == 2 + 2 + 1 + 1


def test_left_nested_chain_peak_does_not_grow_and_its_compute_is_quadratic():
    for n in (2, 5, 13, 40):
        cost = ckpt.simulate(ckpt.left_nested(n), A, S)
        assert cost.peak == A + 4 * S
        # forward n, then the checkpoint of j blocks recomputes them all: 2 + ... + n, and the
        # innermost C(b) one more
        assert cost.compute == n + sum(range(2, n + 1)) + 1
    assert ckpt.peak_terms(ckpt.left_nested(20), A, S) == (1, 4)
    assert ckpt.peak_terms(ckpt.no_checkpointing(20), A, S) == (20, 22)


# --- the dynamic programme against brute force -----------------------------------------------

def _front(costs):
    front = []
    for peak, compute in sorted(set(costs)):
        if not front or compute < front[-1][1]:
            front.append((peak, compute))
    return front


@pytest.mark.parametrize("units", [(1, 1), (A, S), (1, 5), (2.5, 1)])
@pytest.mark.parametrize("early_stop", [True, False])
def test_programme_finds_the_brute_force_optimum_and_front(units, early_stop):
    programme = ckpt.Programme(*units, early_stop=early_stop)
    for n in range(1, 5):
        trees = list(ckpt.all_strategies(n))
        costs = [ckpt.simulate(t, *units, early_stop) for t in trees]
        brute = _front((c.peak, c.compute) for c in costs)
        front = programme.pareto(n)
        assert [(c.peak, c.compute) for _, c in front] == brute
        for tree, cost in front:  # each tree the programme returns costs what it says
            assert ckpt.simulate(tree, *units, early_stop) == cost


def test_enumeration_counts_every_tree_once():
    counts = [sum(1 for _ in ckpt.all_strategies(n)) for n in range(1, 5)]
    assert counts == [2, 8, 48, 352]
    trees = list(ckpt.all_strategies(4))
    assert len(set(trees)) == len(trees)


def test_programme_optimum_is_the_chain_with_a_plain_last_block():
    programme = ckpt.Programme(A, S)
    for n in range(2, 12):
        tree, cost = programme.optimal(n)
        assert tree == (ckpt.left_nested(n - 1)[0], BLOCK)
        assert cost.peak == ckpt.simulate(ckpt.left_nested(n), A, S).peak == A + 4 * S


def test_growth_classes_of_known_sequences():
    ns = list(range(8, 65))
    assert ckpt.growth(ns, [7.0] * len(ns))["class"] == "1"
    assert ckpt.growth(ns, [3 * n + 2 for n in ns])["class"] == "N"
    assert ckpt.growth(ns, [n * n / 2 + n for n in ns])["class"] == "N²"
    log = ckpt.growth(ns, [2 * math.log2(n) + 5 for n in ns])
    assert log["class"] == "log N" and log["coefficient"] == pytest.approx(2)
    assert ckpt.growth(ns, [n ** 0.5 for n in ns])["doubling_ratio"] == pytest.approx(2 ** 0.5)


# --- LiveBytes, the CPU stand-in for the allocator's peak ------------------------------------

def test_live_bytes_follows_known_allocations_and_frees():
    with LiveBytes() as live:
        a = torch.empty(1000)                      # 4000 bytes
        b = torch.empty(1000, dtype=torch.float64)  # 8000
        view = a.view(10, 100)                      # a view: nothing new
        a.add_(1)                                   # in place: nothing new
        assert live.live_bytes == 12000
        del a
        assert live.live_bytes == 12000             # the view keeps the storage
        del view
        assert live.live_bytes == 8000
        c = torch.empty(250)
        assert live.live_bytes == 9000
        del b, c
        assert live.live_bytes == 0
    assert live.peak_bytes == 12000 and live.start_bytes == 0


def test_live_bytes_counts_existing_tensors_and_sees_backward():
    n = 64
    x = torch.randn(n, n, requires_grad=True)
    with LiveBytes([x]) as live:
        assert live.start_bytes == n * n * 4
        # x * 2 is freed at once (mul by a number saves nothing); exp saves its output y
        y = (x * 2).exp()
        after_forward = live.live_bytes
        y.sum().backward()  # backward runs on this thread, under the mode
        del y
        # left: x and its gradient, which backward made
        assert x.grad is not None and live.live_bytes == 2 * n * n * 4
    assert after_forward == 2 * n * n * 4
    # exp's backward made grad * y while x and y were alive, then mul's backward made x.grad
    assert live.peak_bytes >= 4 * n * n * 4


def test_live_bytes_orders_checkpointing_as_the_simulator(blocks):
    shape = (1, 16, MODEL_SIZES["tiny"].d_model)
    peaks = {name: nested.measure_strategy(make(4), blocks[:4], shape, torch.device("cpu"))
             ["peak_bytes"] for name, (_, make) in ckpt.STRATEGIES.items()}
    assert peaks["none"] > peaks["one_level_1"] > peaks["left_nested"]
    assert peaks["one_level_1"] > peaks["bisection"] >= peaks["left_nested"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_window_reads_the_allocator_on_cuda():
    device = torch.device("cuda")
    with peak_window(device) as reading:
        a = torch.empty(2**20, device=device)   # 4 MiB
        b = torch.empty(2**20, device=device)
        del a, b
    assert reading.source == PEAK_SOURCES["cuda"]
    assert reading.peak_bytes - reading.start_bytes == 8 * 2**20


# --- the strategies on real blocks -----------------------------------------------------------

@pytest.fixture(scope="module")
def blocks():
    spec = MODEL_SIZES["tiny"]
    torch.manual_seed(0)
    rope = RotaryEmbedding(spec.d_model // spec.num_heads, 16)
    return [TransformerBlock(spec.d_model, spec.num_heads, spec.d_ff, rope,
                             get_attention("eager")) for _ in range(4)]


def test_nested_checkpoints_compute_the_same_gradient_as_no_checkpointing(blocks):
    x = torch.randn(2, 16, MODEL_SIZES["tiny"].d_model, dtype=torch.float32)
    grads = {}
    for name, strategy in (("none", ckpt.no_checkpointing(4)), ("left", ckpt.left_nested(4)),
                           ("bisection", ckpt.bisection(4))):
        xi = x.clone().requires_grad_()
        out = nested.run_strategy(strategy, blocks)(xi)
        grads[name] = torch.autograd.grad(out.square().sum(), xi)[0]
    torch.testing.assert_close(grads["left"], grads["none"])
    torch.testing.assert_close(grads["bisection"], grads["none"])


def test_block_calls_on_real_blocks_equal_the_simulated_compute(blocks):
    shape = (1, 16, MODEL_SIZES["tiny"].d_model)
    units = nested.block_units(blocks, shape, torch.device("cpu"))
    assert units["boundary"] == 16 * MODEL_SIZES["tiny"].d_model * 4
    for n in (1, 3, 4):
        for tree in (*[make(n) for _, make in ckpt.STRATEGIES.values()],
                     ckpt.optimal(n, units["activations"], units["boundary"])[0]):
            measured = nested.measure_strategy(tree, blocks[:n], shape, torch.device("cpu"))
            assert measured["block_calls"] == ckpt.simulate(tree).compute, ckpt.notation(tree)


# --- the experiment CLIs ---------------------------------------------------------------------

def test_step_cli_records_peak_and_time_on_the_cpu(tmp_path):
    out = tmp_path / "r.json"
    record = cli.main(["--size", "tiny", "--context-length", "16", "--mode",
                       "forward-backward", "--batch-size", "1", "--checkpoint-block-size", "1",
                       "--warmup-steps", "1", "--measure-steps", "2", "--device", "cpu",
                       "--output", str(out)])
    assert record["status"] == "ok" and json.loads(out.read_text()) == record
    m = record["metrics"]
    assert m["peak_source"] == PEAK_SOURCES["cpu"] and m["checkpoints"] == 2
    assert m["peak_gib"] > m["start_gib"] > 0
    assert m["above_start_gib"] == pytest.approx(m["peak_gib"] - m["start_gib"])
    assert len(m["step_ms_samples"]) == 2 and len(m["warmup_step_ms_samples"]) == 1


def test_step_cli_rejects_forward_and_bad_block_sizes(tmp_path, capsys):
    base = ["--size", "tiny", "--context-length", "16", "--output", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit):
        cli.main([*base, "--mode", "forward"])
    assert "nothing to recompute" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*base, "--mode", "train-step", "--checkpoint-block-size", "0"])
    assert "positive integer" in capsys.readouterr().err


def test_nested_cli_records_every_strategy_beside_the_simulator(tmp_path):
    record = nested_cli.main(["--size", "tiny", "--context-length", "16", "--batch-size", "1",
                              "--blocks", "2", "1", "--device", "cpu",
                              "--output", str(tmp_path / "n.json")])
    assert record["status"] == "ok" and record["config"]["blocks"] == [1, 2]
    rows = record["metrics"]["rows"]
    assert len(rows) == 2 * (len(ckpt.STRATEGIES) + 1)
    assert all(r["block_calls"] == r["simulated_compute"] for r in rows)
    assert all(r["peak_bytes"] >= r["simulated_peak_bytes"] for r in rows)
