"""What autograd saves for backward (residuals), counted one way for the whole project.

    with SavedTensors(block) as saved:
        y = block(x)
    account = saved.account(y)
    account.saved_bytes, account.saved_count     # activations: unique storages, bytes
    account.operations()                         # by the operation that saved them, largest first

Every tensor autograd saves passes through `torch.autograd.graph.saved_tensors_hooks`' pack
hook; `SavedTensors` counts each underlying storage once (views of one storage, and a tensor
saved by several operations, count once), with its dtype, shape, and where it was first saved:
the innermost frame inside this package at pack time (file:line, function, the source line,
and the module path, read from the frame's `self`). Storages of the module's own parameters
and buffers are told apart (`kind`): they are not activations.

`account(outputs)` walks the autograd graph from the outputs' `grad_fn` and joins each node's
saved tensors (`_saved_*` attributes; a custom Function's `saved_tensors`) to the hook's
storages, so each storage also gets the operation that saved it first, in forward order
(`MmBackward0`, `SoftmaxBackward0`). Under `torch.compile` one node, `CompiledFunctionBackward`,
saves everything; `capture_compiled_graphs` keeps the forward graph that AOTAutograd's
partitioner made, and the join names each saved tensor by the graph node that produced it
(`aten.rsqrt`, `aten.mm`) with its module path and source line from the node's metadata.
Tensors a node holds outside `save_for_backward` (AOTAutograd's `_tensors_no_vc_check`, a
Python number an op wraps into a tensor) are found by the walk alone and marked `hooked: False`;
the totals leave them out. `SavedTensors(module, hooks=False)` registers no hooks and counts
what the walk finds instead (`WALK_METHOD`): the fallback where hooks cannot run.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from cs336_systems.paths import PACKAGE_DIR

THIS_FILE = str(Path(__file__).resolve())
STACK_DEPTH = 3          # project frames kept per storage, innermost first
STORAGE_KINDS = ("activation", "parameter", "buffer")
METHOD = "torch.autograd.graph.saved_tensors_hooks, joined to the autograd graph"
WALK_METHOD = ("the autograd graph's saved tensors alone (saved_tensors_hooks failed: see "
               "hooks_error)")
GRAPH_INPUT = "input of the compiled graph"
COMPILED_METHOD = METHOD + ("; compiled saves named from the forward graph of AOTAutograd's "
                            "partitioner (inductor's inner_compile)")


@dataclass
class Site:
    """A line of this project's code: where a tensor was saved (eager) or made (compiled)."""

    module: str       # module path in the measured module ("ffn.w1"), its class for the root
    function: str     # "Linear.forward"
    file: str         # relative to the package: "model.py"
    line: int
    code: str         # the source line, stripped

    def label(self) -> str:
        return f"{self.module}: {self.code}"


@dataclass
class SavedStorage:
    """One storage that autograd holds for backward."""

    bytes: int
    dtype: str
    shape: list[int]          # of the first tensor saved from it
    kind: str                 # one of STORAGE_KINDS
    name: str = ""            # the parameter's or buffer's name
    packs: int = 0            # saved tensors on this storage (views and repeats included)
    hooked: bool = True       # seen by the pack hook (False: only by the graph walk)
    order: int = 0            # first seen, in forward order
    op: str = ""              # the operation that saved it first ("" if no node was reached)
    saved_by: list[str] = field(default_factory=list)   # "MulBackward0.self", ...
    site: Site | None = None
    stack: list[Site] = field(default_factory=list)     # project frames, innermost first
    group: str = ""           # the operation instance (for `operations`)
    credit: int | None = None  # sequence number of the node credited

    def row(self) -> dict:
        """The record's view: the fields, the site flattened, the stack as
        `function (file:line)`."""
        out = {k: v for k, v in asdict(self).items() if k not in ("site", "stack", "credit")}
        out["site"] = self.site.label() if self.site else ""
        out.update({f"site_{k}": v for k, v in (asdict(self.site) if self.site else {}).items()})
        out["stack"] = [f"{s.function} ({s.file}:{s.line})" for s in self.stack]
        return out


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    return t.untyped_storage()


def _sequence_now() -> int:
    """The autograd sequence number the next node on this thread will get: nodes made between
    two readings are the window's (nodes number themselves in forward order)."""
    with torch.enable_grad():
        probe = torch.zeros((), requires_grad=True) * 1
    return probe.grad_fn._sequence_nr() + 1


def _module_names(module: nn.Module | None) -> dict[int, str]:
    if module is None:
        return {}
    root = type(module).__name__
    return {id(m): (name or root) for name, m in module.named_modules(remove_duplicate=False)}


def project_frames(names: dict[int, str], depth: int = STACK_DEPTH) -> list[Site]:
    """This package's frames on the current stack (this module's own excluded), innermost
    first; each with the module whose method it is (its `self`), else the nearest caller's."""
    sites, frame = [], sys._getframe(1)
    while frame is not None and len(sites) < depth:
        path = frame.f_code.co_filename
        if path != THIS_FILE and path.startswith(str(PACKAGE_DIR)):
            owner = frame.f_locals.get("self")
            sites.append(Site(module=names.get(id(owner), ""),
                              function=getattr(frame.f_code, "co_qualname", frame.f_code.co_name),
                              file=str(Path(path).relative_to(PACKAGE_DIR)),
                              line=frame.f_lineno,
                              code=linecache.getline(path, frame.f_lineno).strip()))
        frame = frame.f_back
    for i, site in enumerate(sites):  # a plain function (eager_attention): its caller's module
        if not site.module:
            site.module = next((s.module for s in sites[i + 1:] if s.module), "")
    return sites


class SavedTensors:
    """Context manager around a forward: every tensor autograd saves meanwhile, by storage.

    `module` (optional) names the parameters and buffers to tell apart from activations and
    the module paths of the sites. The storages stay referenced until the object is dropped,
    so their identities cannot be reused while it counts.
    """

    def __init__(self, module: nn.Module | None = None, hooks: bool = True):
        self.hooks = hooks
        self._owners: dict[int, tuple[str, str]] = {}
        if module is not None:
            for kind, named in (("parameter", module.named_parameters()),
                                ("buffer", module.named_buffers())):
                for name, tensor in named:
                    self._owners.setdefault(_storage(tensor)._cdata, (kind, name))
        self._names = _module_names(module)
        self._storages: dict[int, SavedStorage] = {}
        self._alive: dict[int, torch.UntypedStorage] = {}
        self.packs = 0
        self._hooks = None
        self.window = (0, 0)

    def _new(self, t: torch.Tensor, storage: torch.UntypedStorage, hooked: bool,
             stack: list[Site]) -> SavedStorage:
        kind, name = self._owners.get(storage._cdata, ("activation", ""))
        entry = SavedStorage(bytes=storage.nbytes(), dtype=str(t.dtype).removeprefix("torch."),
                             shape=list(t.shape), kind=kind, name=name, hooked=hooked,
                             order=len(self._storages), stack=stack,
                             site=stack[0] if stack else None)
        self._storages[storage._cdata] = entry
        self._alive[storage._cdata] = storage
        return entry

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = _storage(t)
        entry = self._storages.get(storage._cdata)
        if entry is None:
            entry = self._new(t, storage, True, project_frames(self._names))
        entry.packs += 1
        self.packs += 1
        return t

    def __enter__(self) -> SavedTensors:
        start = _sequence_now()
        if self.hooks:
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self._hooks.__enter__()
        self.window = (start, start)
        return self

    def __exit__(self, *exc) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None
        self.window = (self.window[0], _sequence_now())

    def account(self, outputs, graphs: Iterable[torch.fx.GraphModule] = ()) -> Account:
        """Join the storages to the autograd graph behind `outputs` (a tensor or a nest of
        them); `graphs`: the compiled forward graphs (`capture_compiled_graphs`), if any.

        A storage is credited to the node that saved it first in forward order (the lowest
        sequence number); under a compiled node, to the graph node that made it."""
        start, end = self.window
        savers: dict[int, list[tuple[int, str]]] = {}
        for node in walk(outputs):
            seq, name = node._sequence_nr(), node.name()
            if not start <= seq < end:
                continue                         # made before the window (or AccumulateGrad)
            saved = node_saved_tensors(node)
            made = compiled_sites(saved, graphs, self._names) if "CompiledFunction" in name \
                else None
            for i, (attr, t) in enumerate(saved):
                storage = _storage(t)
                entry = self._storages.get(storage._cdata)
                if entry is None:
                    entry = self._new(t, storage, False, [])
                savers.setdefault(storage._cdata, []).append((seq, f"{name}.{attr}"))
                if entry.credit is not None and entry.credit <= seq:
                    continue
                entry.credit, entry.op, entry.group = seq, name, f"{name}#{seq}"
                if made is not None:
                    op, node_name, site = made[i]
                    entry.op, entry.group, entry.site = op, f"{name}#{seq}:{node_name}", site
                    entry.stack = [site] if site else []
        for key, entry in self._storages.items():
            entry.saved_by = [name for _, name in sorted(savers.get(key, []))]
        references = sum(len(v) for v in savers.values())
        return Account(sorted(self._storages.values(), key=lambda s: s.order),
                       self.packs if self.hooks else references, self.hooks)


def walk(outputs) -> Iterator:
    """Every autograd node behind `outputs`, each once."""
    tensors = [t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(child for child, _ in node.next_functions)


def node_saved_tensors(node) -> list[tuple[str, torch.Tensor]]:
    """(attribute, tensor) for each tensor a node holds for its backward: a built-in node's
    `_saved_*` attributes, a custom Function's `saved_tensors` and what AOTAutograd keeps
    beside them."""
    out: list[tuple[str, torch.Tensor]] = []
    if hasattr(node, "saved_tensors"):              # custom autograd.Function (compiled too)
        tensors = list(node.saved_tensors) + list(getattr(node, "_tensors_no_vc_check", []))
        return [(f"saved[{i}]", t) for i, t in enumerate(tensors) if isinstance(t, torch.Tensor)]
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:                         # freed, or an undefined optional tensor
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        out += [(attr.removeprefix("_saved_"), t) for t in values if isinstance(t, torch.Tensor)]
    return out


# --- torch.compile: the forward graph that AOTAutograd partitioned ---------------------------

def capture_compiled_graphs(codegen: bool = True) -> tuple[callable, list[torch.fx.GraphModule]]:
    """A torch.compile backend that is inductor (`compile_fx`) and keeps each forward graph its
    inner compiler receives (after AOTAutograd's partitioner: its outputs are the forward's
    results followed by what backward needs), and the list it fills. AOTAutograd's cache is off
    while it compiles, since a cache hit would skip the partitioner and leave nothing to keep.

    With `codegen=False` the partitioned graphs run as they are instead of being compiled into
    kernels: the same tensors are saved, without the kernels' compilation (seconds of C++
    compilation per graph on a CPU)."""
    from functorch.compile import make_boxed_func
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    graphs: list[torch.fx.GraphModule] = []

    def inner(gm, example_inputs, **kwargs):
        if not kwargs.get("is_backward", False):
            graphs.append(gm)
        if not codegen:
            return make_boxed_func(gm.forward)
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        patch = ({"enable_autograd_cache": False}
                 if hasattr(functorch_config, "enable_autograd_cache") else {})
        with functorch_config.patch(patch):
            return compile_fx(gm, example_inputs, inner_compile=inner)

    return backend, graphs


def compile_keeping_graphs(module: nn.Module, codegen: bool = True
                           ) -> tuple[nn.Module, list[torch.fx.GraphModule]]:
    """`torch.compile(module, fullgraph=True)` through inductor, and the list its forward
    graphs go into when it compiles (on its first call); `codegen` as `capture_compiled_graphs`
    says."""
    backend, graphs = capture_compiled_graphs(codegen)
    return torch.compile(module, fullgraph=True, backend=backend), graphs


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_MODULE_PATH = re.compile(r"^(?:L\['[^']+'\]|L__self__|self)\.?")


def _module_path(meta: dict, names: dict[int, str]) -> tuple[str, str]:
    """(module path, class name) of the innermost module in an FX node's nn_module_stack."""
    stack = meta.get("nn_module_stack") or {}
    if not stack:
        return next(iter(names.values()), ""), ""
    path, cls = list(stack.values())[-1]
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", str(path))
    path = _MODULE_PATH.sub("", path).strip(".")
    return path or next(iter(names.values()), ""), getattr(cls, "__name__", str(cls))


def graph_site(node: torch.fx.Node, names: dict[int, str]) -> Site | None:
    """The innermost frame of this package in an FX node's stack trace."""
    frames = [m for m in _FRAME.finditer(node.meta.get("stack_trace") or "")
              if m.group(1).startswith(str(PACKAGE_DIR)) and m.group(1) != THIS_FILE]
    if not frames:
        return None
    path, line, function, code = frames[-1].groups()
    module, cls = _module_path(node.meta, names)
    return Site(module=module, function=f"{cls}.{function}" if cls else function,
                file=str(Path(path).relative_to(PACKAGE_DIR)), line=int(line), code=code.strip())


def compiled_sites(saved: list[tuple[str, torch.Tensor]], graphs: Iterable[torch.fx.GraphModule],
                   names: dict[int, str]) -> list[tuple[str, str, Site | None]] | None:
    """For each tensor a CompiledFunctionBackward saved: the op of the graph node that made it
    ("aten.rsqrt"; GRAPH_INPUT for an input of the compiled graph), the node's name and its
    site.

    AOTAutograd saves the forward graph's outputs that follow the user's, in order (symbolic
    ints after them), so the saved tensors are the graph's last tensor outputs; the graph whose
    shapes match is the one. None if no captured graph matches."""
    shapes = [tuple(t.shape) for _, t in saved]
    for gm in graphs:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        nodes = [n for n in output.args[0]
                 if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]
        tail = nodes[len(nodes) - len(saved):] if len(nodes) >= len(saved) else []
        if not saved or [tuple(n.meta["val"].shape) for n in tail] != shapes:
            continue
        out = []
        for n in tail:
            maker = storage_maker(n)
            out.append((GRAPH_INPUT, maker.name, None) if maker.op == "placeholder" else
                       (_op_name(maker.target), maker.name, graph_site(maker, names)))
        return out
    return None


def storage_maker(node: torch.fx.Node) -> torch.fx.Node:
    """The graph node that made `node`'s storage: back through views (a node whose first
    argument's fake tensor has the same storage) to the op that allocated it."""
    while node.args and isinstance(node.args[0], torch.fx.Node):
        value, base = node.meta.get("val"), node.args[0].meta.get("val")
        if not (isinstance(value, torch.Tensor) and isinstance(base, torch.Tensor)
                and value.untyped_storage()._cdata == base.untyped_storage()._cdata):
            break
        node = node.args[0]
    return node


def _op_name(target) -> str:
    """aten.mm.default -> aten.mm."""
    text = str(target)
    return ".".join(text.split(".")[:2]) if text.startswith("aten.") else text


# --- the account -----------------------------------------------------------------------------

@dataclass
class Account:
    """What one forward saved: every storage, and sums over the activations."""

    storages: list[SavedStorage]
    packs: int                # saved tensors (views and repeats included)
    hooked: bool = True       # counted by the pack hook (False: by the graph walk alone)

    def counted(self, s: SavedStorage) -> bool:
        return s.hooked or not self.hooked

    @property
    def activations(self) -> list[SavedStorage]:
        """What was counted that is not a parameter or buffer of the module."""
        return [s for s in self.storages if s.kind == "activation" and self.counted(s)]

    @property
    def saved_bytes(self) -> int:
        return sum(s.bytes for s in self.activations)

    @property
    def saved_count(self) -> int:
        return len(self.activations)

    def operations(self) -> list[dict]:
        """Activation bytes by the operation that saved them first (compiled: the graph node
        that made them), largest first, with their share of the total."""
        groups: dict[str, dict] = {}
        for s in self.activations:
            where = s.site
            g = groups.setdefault(s.group or f"(not reached)#{s.order}", {
                "operation": s.op or "(not reached)",
                "label": f"{where.label()} ({s.op})" if where else (s.op or "(not reached)"),
                "module": where.module if where else "",
                "function": where.function if where else "",
                "where": f"{where.file}:{where.line}" if where else "",
                "code": where.code if where else "", "bytes": 0, "storages": 0,
                "shapes": [], "dtypes": [], "order": s.order})
            g["bytes"] += s.bytes
            g["storages"] += 1
            g["shapes"].append(s.shape)
            g["dtypes"].append(s.dtype)
        total = self.saved_bytes or 1
        rows = sorted(groups.values(), key=lambda g: (-g["bytes"], g["order"]))
        for g in rows:
            g["share"] = g["bytes"] / total
            g["dtypes"] = sorted(set(g["dtypes"]))
        return rows

    def metrics(self) -> dict:
        """The record's view: sums, every storage and the operations."""
        excluded = [s for s in self.storages if s.kind != "activation" and self.counted(s)]
        unhooked = [s for s in self.storages if not self.counted(s)]
        return {"saved_count": self.saved_count, "saved_bytes": self.saved_bytes,
                "saved_tensors": self.packs,
                "unhooked_storages": len(unhooked),
                "unhooked_bytes": sum(s.bytes for s in unhooked),
                "parameter_storages": len(excluded),
                "parameter_bytes": sum(s.bytes for s in excluded),
                "storages": [{**s.row(), "counted": self.counted(s)} for s in self.storages],
                "operations": self.operations()}


# --- gradients -------------------------------------------------------------------------------

def gradient_bytes(module: nn.Module, inputs: Iterable[torch.Tensor]) -> dict[str, int]:
    """After a backward: the bytes of the module's parameter gradients and of the inputs'
    gradients (the names of `memory_model.block_gradient_bytes`)."""
    def size(t):
        return t.numel() * t.element_size() if t is not None else 0

    return {"parameter gradients": sum(size(p.grad) for p in module.parameters()),
            "input gradient": sum(size(x.grad) for x in inputs)}
