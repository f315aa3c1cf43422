"""gradient_checkpointing (assignment §2 (a)): nested checkpoint strategies for a chain of N
identical blocks, what each keeps and recomputes, and the one that needs the least memory.

    strategy = left_nested(8)               # (C(C(C(...C(b),b)...),b),): a tree of parts
    simulate(strategy, activations=1, boundary=1)            # Cost(peak=5, compute=...)
    optimal(8, activations=1, boundary=1)   # the least peak over every nested tree (a DP)

A strategy is the top-level sequence of parts; a part is a plain block (`BLOCK`) or a
`Checkpoint` of a sequence of parts. Costs are in units: `activations` (A) is what one block
keeps for its backward besides its input, `boundary` (s) one tensor between blocks (a block's
input or output, or a gradient of one); compute counts block forward evaluations, first pass
and recomputations together. The checkpointing section's `nested` module runs the same trees on real
modules with torch's checkpoint (`run_strategy`).

The simulator follows PyTorch's non-reentrant checkpoint (`use_reentrant=False`):
- forward: a plain block keeps its input and A until its backward; a checkpoint keeps only its
  input and runs its parts keeping nothing (nested checkpoints inside keep nothing either);
  while a block computes, its A and its output are allocated (A freed at once if not kept);
- backward of a checkpoint: run its parts forward again from its input, each as its own
  strategy says (a nested checkpoint keeps its input only), then backpropagate them in reverse;
  with early stop (PyTorch's default) the recomputation ends as soon as the last tensor the
  parts saved is back, so a trailing nested checkpoint is not run there;
- backward of a plain block: allocate its input's gradient, then free A, its input and its
  output's gradient. The loss holds the output until the first gradient is allocated.
Peak = the most units alive at any moment of forward + backward, boundaries included.

`optimal` is a dynamic programme over every nested tree, memoised on segment length: in a
sequence every part adds the same units to what is alive during every later part (its input,
and A if plain), so a sequence's peak is max_j (kept by parts before j + part j's own peak),
and a checkpoint's peak depends on its inside only through one number. Pareto fronts of
(peak, compute) per length make the tie-break on compute exact; `all_strategies` enumerates
every tree for small N so tests can check the programme against brute force.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction


class _Block:
    """A plain block: runs once in forward, keeps its activations for backward."""

    def __repr__(self) -> str:
        return "b"


BLOCK = _Block()


@dataclass(frozen=True)
class Checkpoint:
    """A checkpointed segment: keeps its input, recomputes `parts` in backward."""

    parts: tuple

    def __repr__(self) -> str:
        return f"C({notation(self.parts)})"


Part = _Block | Checkpoint
Strategy = tuple  # tuple[Part, ...]: the top-level sequence


def length(parts: Strategy | Part) -> int:
    """Blocks in a part or a sequence of parts."""
    if parts is BLOCK:
        return 1
    if isinstance(parts, Checkpoint):
        return length(parts.parts)
    return sum(length(p) for p in parts)


def notation(parts: Strategy) -> str:
    """`C(C(b),b),b`; runs of one part written once with a count: `b×4`."""
    out, i = [], 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        out.append(repr(parts[i]) + (f"×{j - i + 1}" if j > i else ""))
        i = j + 1
    return ",".join(out)


def no_checkpointing(n: int) -> Strategy:
    return (BLOCK,) * n


def one_level(n: int, k: int) -> Strategy:
    """Groups of k blocks (the last may be shorter), each one checkpoint: what
    `TransformerLM(checkpoint_block_size=k)` does."""
    return tuple(Checkpoint((BLOCK,) * min(k, n - start)) for start in range(0, n, k))


def one_level_sqrt(n: int) -> Strategy:
    """One level with groups of ceil(sqrt(N)) blocks: the classic sqrt(N) trade-off."""
    return one_level(n, math.isqrt(n - 1) + 1 if n > 1 else 1)


def bisection(n: int) -> Strategy:
    """Halve recursively: two checkpoints, each of which halves its half again; single blocks
    plain."""
    if n == 1:
        return (BLOCK,)
    half = n // 2
    return (Checkpoint(bisection(half)), Checkpoint(bisection(n - half)))


def left_nested(n: int) -> Strategy:
    """C(C(C(C(b),b),b),b): each checkpoint holds the previous one and one more block, so
    during any backward one block's activations and a few boundaries are alive."""
    part: Part = Checkpoint((BLOCK,))
    for _ in range(n - 1):
        part = Checkpoint((part, BLOCK))
    return (part,)


# The name of the programme's optimum beside the named strategies (`optimal`).
OPTIMAL = "optimal"

# name -> (label, strategy of N blocks): the strategies the section compares
STRATEGIES: dict[str, tuple[str, Callable[[int], Strategy]]] = {
    "none": ("no checkpointing", no_checkpointing),
    "one_level_1": ("one level, k = 1", lambda n: one_level(n, 1)),
    "one_level_sqrt": ("one level, k = ⌈√N⌉", one_level_sqrt),
    "bisection": ("recursive bisection", bisection),
    "left_nested": ("left-nested chain", left_nested),
}


@dataclass(frozen=True)
class Cost:
    peak: float      # units
    compute: int     # block forward evaluations


class _Tensor:
    __slots__ = ("size", "refs")

    def __init__(self, size):
        self.size, self.refs = size, 1


class _Run:
    """One forward + backward of a strategy, tensor by tensor, with reference counts."""

    def __init__(self, activations, boundary, early_stop: bool):
        self.a, self.s, self.early_stop = activations, boundary, early_stop
        self.live = self.peak = 0
        self.compute = 0

    def alloc(self, size) -> _Tensor:
        self.live += size
        self.peak = max(self.peak, self.live)
        return _Tensor(size)

    @staticmethod
    def ref(t: _Tensor) -> None:
        t.refs += 1

    def unref(self, t: _Tensor) -> None:
        t.refs -= 1
        if t.refs == 0:
            self.live -= t.size

    def forward(self, parts: Strategy, x: _Tensor, saving: bool, stop_early: bool
                ) -> tuple[_Tensor | None, list]:
        """Run `parts` from x (which the caller holds). Returns the output (the caller's to
        free; None if the recomputation stopped early) and what each part kept."""
        cur, kept = x, []
        self.ref(cur)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if part is BLOCK:
                a = self.alloc(self.a)
                self.compute += 1
                if saving:
                    kept.append((a, cur))
                    self.ref(cur)
                    if stop_early and last:
                        self.unref(cur)
                        return None, kept
                out = self.alloc(self.s)
                if not saving:
                    self.unref(a)
            else:
                if saving:
                    kept.append(cur)
                    self.ref(cur)
                    if stop_early and last:
                        self.unref(cur)
                        return None, kept
                out, _ = self.forward(part.parts, cur, saving=False, stop_early=False)
            self.unref(cur)
            cur = out
        return cur, kept

    def backward(self, parts: Strategy, kept: list, grad: _Tensor) -> _Tensor:
        """Backpropagate `grad` (the output's gradient, consumed) through `parts`; returns the
        input's gradient."""
        for part, saved in reversed(list(zip(parts, kept))):
            if part is BLOCK:
                a, x = saved
                grad_in = self.alloc(self.s)
                self.unref(a)
                self.unref(x)
                self.unref(grad)
                grad = grad_in
            else:
                out, inner = self.forward(part.parts, saved, saving=True,
                                          stop_early=self.early_stop)
                if out is not None:
                    self.unref(out)
                grad = self.backward(part.parts, inner, grad)
                self.unref(saved)
        return grad


def simulate(strategy: Strategy, activations=1, boundary=1, early_stop: bool = True) -> Cost:
    """Peak units and block evaluations of one forward + backward of `strategy`."""
    run = _Run(activations, boundary, early_stop)
    x = run.alloc(boundary)
    y, kept = run.forward(strategy, x, saving=True, stop_early=False)
    run.unref(x)
    grad = run.alloc(boundary)  # the loss's gradient; the loss lets go of the output
    run.unref(y)
    run.unref(run.backward(strategy, kept, grad))
    if run.live != 0:
        raise AssertionError(f"simulation leaked {run.live} units")
    return Cost(run.peak, run.compute)


def peak_terms(strategy: Strategy, activations=1, boundary=1, early_stop: bool = True
               ) -> tuple[float, float] | None:
    """The peak as a * A + b * s near these units: (a, b) from doubling each unit in turn, or
    None where the peak is not that sum (a different moment peaks when a unit doubles)."""
    peak = simulate(strategy, activations, boundary, early_stop).peak
    a = (simulate(strategy, 2 * activations, boundary, early_stop).peak - peak) / activations
    b = (simulate(strategy, activations, 2 * boundary, early_stop).peak - peak) / boundary
    return (a, b) if math.isclose(a * activations + b * boundary, peak) else None


@functools.cache
def _bodies(n: int) -> tuple[Strategy, ...]:
    """Sequences of n blocks that may be a checkpoint's parts: two parts or more, or one plain
    block (a checkpoint of a lone checkpoint is left out: it recomputes the same blocks twice
    and keeps the same input)."""
    out = [(BLOCK,)] if n == 1 else []
    for k in range(1, n):
        heads = ([BLOCK] if k == 1 else []) + [Checkpoint(b) for b in _bodies(k)]
        out += [(h, *rest) for h in heads for rest in _sequences(n - k)]
    return tuple(out)


@functools.cache
def _sequences(n: int) -> tuple[Strategy, ...]:
    """Every top-level sequence of n blocks: a body, or one checkpoint around a body."""
    return _bodies(n) + tuple((Checkpoint(b),) for b in _bodies(n))


def all_strategies(n: int) -> Iterator[Strategy]:
    """Every nested strategy for n blocks (grows fast: for brute-force checks at small n)."""
    return iter(_sequences(n))


class _Option:
    """A sequence in the programme: its peak term, its compute, and how to build its tree:
    a first part (`BLOCK`, or the body `_Option` of a checkpoint) and the rest (None: none)."""

    __slots__ = ("peak", "compute", "head", "rest")

    def __init__(self, peak: int, compute: int, head=None, rest: _Option | None = None):
        self.peak, self.compute, self.head, self.rest = peak, compute, head, rest

    def tree(self) -> Strategy:
        parts, option = [], self
        while option is not None and option.head is not None:
            parts.append(BLOCK if option.head is BLOCK else Checkpoint(option.head.tree()))
            option = option.rest
        return tuple(parts)


def _front(options: Iterable[tuple]) -> list[_Option]:
    """The Pareto front of (peak, compute, head, rest) candidates: least compute for each
    peak, peaks ascending, compute descending (among equals, the first found)."""
    best: dict[int, tuple] = {}
    for option in options:
        known = best.get(option[0])
        if known is None or option[1] < known[1]:
            best[option[0]] = option
    front: list[_Option] = []
    for peak in sorted(best):
        _, compute, head, rest = best[peak]
        if not front or compute < front[-1].compute:
            front.append(_Option(peak, compute, head, rest))
    return front


class _Programme:
    """Pareto fronts of (peak, compute) per segment length, in integer units.

    A part P in a sequence keeps kept(P) while later parts run (s + A if plain, s if a
    checkpoint); in forward it needs f(P) at its peak (its input included: A + 2s plain,
    A + 2s or A + 3s for a checkpoint's no-save pass, less when it ends an early-stopped
    recomputation), in backward b(P) (A + 3s plain; a checkpoint: the peak of its body, below).
    The body of a checkpoint, recomputed with the output's gradient alive, then backpropagated,
    peaks at Q(S) = max_j (kept before j + max(s + f_j, b_j)); the top level at
    T(S) = max(max_j (kept before j + max(f_j, b_j)), all kept + 2s).
    """

    def __init__(self, activations: int, boundary: int, early_stop: bool):
        self.a, self.s, self.early_stop = activations, boundary, early_stop
        self._parts: dict[int, list] = {}
        self._body: dict[int, list[_Option]] = {}
        self._top: dict[int, list[_Option]] = {0: [_Option(2 * boundary, 0)]}  # the loss

    def kept(self, head) -> int:
        return self.s + (self.a if head is BLOCK else 0)

    def forward_peak(self, head, n: int, stopped: bool) -> int:
        if head is BLOCK:
            return self.a + (1 if stopped else 2) * self.s
        return self.s if stopped else self.a + (2 if n == 1 else 3) * self.s

    def plain(self, n: int) -> list[tuple]:
        """A plain block, if n is 1: (head, backward peak, backward compute)."""
        return [(BLOCK, self.a + 3 * self.s, 0)] if n == 1 else []

    def parts(self, n: int) -> list[tuple]:
        """Parts of n blocks: (head, backward peak, backward compute); a checkpoint's head is
        its body's option."""
        if n not in self._parts:
            self._parts[n] = self.plain(n) + [(o, o.peak, o.compute) for o in self.body(n)]
        return self._parts[n]

    def body(self, n: int) -> list[_Option]:
        """Sequences of n blocks inside a checkpoint: (Q, recompute + backward compute). A lone
        checkpoint is left out (see `all_strategies`)."""
        if n in self._body:
            return self._body[n]
        options = []
        for k in range(1, n + 1):
            last = k == n
            stopped = last and self.early_stop
            for head, back, back_compute in self.parts(k) if not last else self.plain(k):
                q = max(self.s + self.forward_peak(head, k, stopped), back)
                compute = (0 if stopped and head is not BLOCK else k) + back_compute
                if last:
                    options.append((q, compute, head, None))
                else:
                    options += self._joined(q, compute, head, self.body(n - k))
        self._body[n] = _front(options)
        return self._body[n]

    def top(self, n: int) -> list[_Option]:
        """Top-level sequences of n blocks: (T, backward compute; add n for the forward)."""
        if n in self._top:
            return self._top[n]
        options = []
        for k in range(1, n + 1):
            for head, back, back_compute in self.parts(k):
                t = max(self.forward_peak(head, k, stopped=False), back)
                options += self._joined(t, back_compute, head, self.top(n - k))
        self._top[n] = _front(options)
        return self._top[n]

    def _joined(self, own: int, compute: int, head, rests: list[_Option]) -> list[tuple]:
        """`head` (whose own peak term is `own`) before each rest of a front: peak
        max(own, kept(head) + rest's). Rests are in ascending peak, descending compute, so of
        those under `own` only the last (least compute) can be on the new front."""
        kept = self.kept(head)
        below = [r for r in rests if kept + r.peak <= own]
        keep = below[-1:] + rests[len(below):]
        return [(max(own, kept + r.peak), compute + r.compute, head,
                 r if r.head is not None else None) for r in keep]


def _integer_units(activations, boundary) -> tuple[int, int, Fraction]:
    """The units as integers, and the scale that divides them back."""
    a, s = Fraction(activations), Fraction(boundary)
    scale = Fraction(math.lcm(a.denominator, s.denominator))
    return int(a * scale), int(s * scale), scale


class Programme:
    """The least peak over every nested tree of n blocks, for every n, in one set of units:
    the fronts of shorter segments are computed once and shared."""

    def __init__(self, activations=1, boundary=1, early_stop: bool = True):
        a, s, self.scale = _integer_units(activations, boundary)
        self._fronts = _Programme(a, s, early_stop)

    def pareto(self, n: int) -> list[tuple[Strategy, Cost]]:
        """Every strategy on the (peak, compute) Pareto front for n blocks, least peak first."""
        for m in range(1, n):  # bottom-up: no deep recursion
            self._fronts.top(m)
        return [(o.tree(), Cost(_number(o.peak / self.scale), n + o.compute))
                for o in self._fronts.top(n)]

    def optimal(self, n: int) -> tuple[Strategy, Cost]:
        """The strategy with the least peak; ties: the least compute."""
        return self.pareto(n)[0]


def pareto(n: int, activations=1, boundary=1, early_stop: bool = True
           ) -> list[tuple[Strategy, Cost]]:
    return Programme(activations, boundary, early_stop).pareto(n)


def optimal(n: int, activations=1, boundary=1, early_stop: bool = True
            ) -> tuple[Strategy, Cost]:
    return Programme(activations, boundary, early_stop).optimal(n)


def _number(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


GROWTH: dict[str, Callable[[float], float]] = {
    "1": lambda n: 1.0,
    "log N": math.log2,
    "√N": math.sqrt,
    "N": lambda n: n,
    "N log N": lambda n: n * math.log2(n),
    "N²": lambda n: n * n,
}


def growth(ns: Sequence[int], values: Sequence[float]) -> dict:
    """Which of `GROWTH` fits values(N) best as a * g(N) + b (least squares; the smallest
    residual relative to the values' mean), its a, and the ratio of the last value to the
    value at half its N: 1 for constant, about 1.4 for sqrt N, 2 for N, 4 for N^2."""
    pairs = sorted(zip(ns, values))
    ns_, ys = [n for n, _ in pairs], [float(v) for _, v in pairs]
    mean = sum(ys) / len(ys)
    if max(ys) - min(ys) <= 1e-9 * max(1.0, abs(mean)):
        best = {"class": "1", "coefficient": 0.0, "residual": 0.0}
    else:
        best = None
        for name, g in GROWTH.items():
            if name == "1":
                continue
            xs = [g(n) for n in ns_]
            mx = sum(xs) / len(xs)
            sxx = sum((x - mx) ** 2 for x in xs)
            a = sum((x - mx) * (y - mean) for x, y in zip(xs, ys)) / sxx
            b = mean - a * mx
            rms = math.sqrt(sum((a * x + b - y) ** 2 for x, y in zip(xs, ys)) / len(ys))
            if best is None or rms / abs(mean) < best["residual"]:
                best = {"class": name, "coefficient": a, "residual": rms / abs(mean)}
    last = ns_[-1]
    half = dict(pairs).get(last // 2) if last % 2 == 0 else None
    best["doubling_ratio"] = ys[-1] / half if half else None
    return best
