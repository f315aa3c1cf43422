"""Launching a Triton kernel with less host time than `kernel[grid](...)`.

Triton's JIT binds and specializes every argument on every launch (each int's value, each
tensor's dtype and 16-byte alignment) to find the compiled binary, and then calls the binary's
launcher. On an H200 with Triton 3.6 that took 24 to 38 us per launch of the flash forward
kernel (30 arguments), against 6 to 9 us for the launcher alone; at the shapes our models
attend over, the kernels themselves take tens of microseconds. `direct(kernel)[grid](...)` takes
the same arguments as `kernel[grid](...)`, for `tl` and Gluon kernels alike: its first launch
of each argument signature goes through the JIT (which compiles), later ones call the binary's
launcher directly.

The signature is what the JIT specializes on: each int argument's value (so a different shape
or stride is a new signature), each tensor's dtype and whether its address is 16-byte
aligned, the keyword arguments (constexprs, warps, stages) and the current device. Launch hooks
(a profiler's `knobs.runtime.launch_enter_hook`) and the interpreter take the JIT's path.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor
from triton import knobs
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime import driver

from cs336_systems.kernels.checks import triton_interpreting


class Launch(NamedTuple):
    """One kernel launch's grid and its keyword arguments (constexprs, warps and stages), made
    once per shape by a kernel module's launch plan."""
    grid: tuple
    kwargs: dict


class DeviceAddress:
    """What a Gluon TMA descriptor's `base` is read for, by the JIT and by the launcher: an
    address and a dtype, with no tensor behind them. A descriptor cached by address, shape and
    tile then keeps no memory alive; it describes the same bytes as any tensor at that address
    of that shape, and is only launched with one."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def _hooked() -> bool:
    """Whether a launch hook is set (None or an empty HookChain, by Triton's version, is not)."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


def _specialized(arg) -> object:
    """What the JIT specializes on in one argument: a tensor's dtype and 16-byte alignment, a
    Gluon TMA descriptor's dtype, block and shared layout (its base is 16-byte aligned by
    construction; its shape and strides are run-time arguments), any other argument's value."""
    if isinstance(arg, Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, TensorDescriptor):
        return arg.base.dtype, tuple(arg.block_shape), arg.layout
    return arg


def _signature(args: tuple, kwargs: dict) -> tuple:
    return (driver.active.get_current_device(), tuple(_specialized(a) for a in args),
            tuple(kwargs.items()))


class DirectLauncher:
    """A jit kernel whose launches skip the JIT once their signature has compiled."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.binaries: dict[tuple, tuple] = {}  # signature -> (binary, constexpr values)

    def __getitem__(self, grid: tuple):
        return functools.partial(self.launch, grid)

    def launch(self, grid: tuple, *args, **kwargs) -> None:
        if _hooked() or triton_interpreting():
            self.kernel[grid](*args, **kwargs)
            return
        signature = _signature(args, kwargs)
        entry = self.binaries.get(signature)
        if entry is None:
            binary = self.kernel[grid](*args, **kwargs)  # compiles (or finds) and launches
            # the launcher takes every parameter in order, constexprs included
            constants = tuple(kwargs[name] for name in self.kernel.arg_names[len(args):])
            self.binaries[signature] = (binary, constants)
            return
        binary, constants = entry
        device = signature[0]
        binary.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                   driver.active.get_current_stream(device), binary.function,
                   binary.packed_metadata, None, None, None, *args, *constants)


@functools.cache
def direct(kernel) -> DirectLauncher:
    """The kernel's one DirectLauncher (its cache of binaries lives as long as the process)."""
    return DirectLauncher(kernel)


def eager_on_plain_tensors(*tensors: Tensor) -> bool:
    """Whether a kernel's autograd function should run its kernels directly rather than through
    its custom operators: in eager mode on plain tensors. Torch's custom-operator dispatch costs
    about 0.5 ms of host time per forward+backward (torch 2.11, H200), more than the kernels
    themselves at small shapes, and wrap_triton outside an operator more still; torch.compile
    (and fake or functional tensors) goes through the operators."""
    return not torch.compiler.is_compiling() and all(type(t) is Tensor for t in tensors)
