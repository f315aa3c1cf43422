"""`launch.direct`: which launches go through the JIT and which call the compiled binary, with
a stand-in kernel and driver (the real launcher needs a GPU; the flash tests run it there)."""

import pytest
import torch

from cs336_systems.kernels import launch


class Binary:
    def __init__(self):
        self.launches = []
        self.function, self.packed_metadata = "function", "metadata"

    def run(self, *args):
        self.launches.append(args)


class Kernel:
    """A jit kernel's surface: kernel[grid](*args, **kwargs) compiles once per signature."""

    arg_names = ["x_ptr", "n", "BLOCK", "FLAG"]

    def __init__(self):
        self.jit_launches = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            return Binary()
        return run


class Driver:
    class active:
        @staticmethod
        def get_current_device():
            return 0

        @staticmethod
        def get_current_stream(device):
            return f"stream{device}"


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(launch, "driver", Driver)
    monkeypatch.setattr(launch, "triton_interpreting", lambda: False)
    monkeypatch.setattr(launch, "_hooked", lambda: False)
    return launch.DirectLauncher(Kernel())


def test_first_launch_of_a_signature_compiles_later_ones_call_the_binary(launcher):
    x = torch.randn(64)
    launcher[(4,)](x, 64, BLOCK=16, FLAG=True, num_warps=4)
    launcher[(4,)](x, 64, BLOCK=16, FLAG=True, num_warps=4)
    launcher[(2, 3)](x, 64, BLOCK=16, FLAG=True, num_warps=4)
    assert len(launcher.kernel.jit_launches) == 1
    (binary, constants), = launcher.binaries.values()
    assert constants == (16, True)  # the constexprs in the kernel's parameter order
    first, second = binary.launches
    assert first[:7] == (4, 1, 1, "stream0", "function", "metadata", None)
    assert first[9:] == (x, 64, 16, True)
    assert second[:3] == (2, 3, 1)


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "warps"])
def test_anything_the_jit_specializes_on_compiles_again(launcher, change):
    x = torch.randn(64)
    launcher[(1,)](x, 64, BLOCK=16, FLAG=True, num_warps=4)
    args, kwargs = [x, 64], dict(BLOCK=16, FLAG=True, num_warps=4)
    if change == "int":
        args[1] = 65
    elif change == "dtype":
        args[0] = x.half()
    elif change == "alignment":
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary
    elif change == "constexpr":
        kwargs["BLOCK"] = 32
    else:
        kwargs["num_warps"] = 8
    launcher[(1,)](*args, **kwargs)
    assert len(launcher.kernel.jit_launches) == 2


def test_a_launch_hook_or_the_interpreter_takes_the_jit_path(launcher, monkeypatch):
    x = torch.randn(64)
    monkeypatch.setattr(launch, "_hooked", lambda: True)
    for _ in range(2):
        launcher[(1,)](x, 64, BLOCK=16, FLAG=True)
    assert len(launcher.kernel.jit_launches) == 2 and not launcher.binaries


def _descriptor(t: torch.Tensor, block_rows: int, swizzle: int = 128):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
    return TensorDescriptor(t, list(t.shape), [t.shape[1], 1], [block_rows, t.shape[1]], layout)


@pytest.mark.parametrize("change", [None, "other tensor", "block", "dtype", "layout"])
def test_a_tma_descriptor_specializes_on_its_dtype_block_and_layout(launcher, change):
    """A Gluon kernel's descriptor: another tensor of the same dtype and shape (a new address)
    reuses the binary; another block, dtype or shared layout compiles again."""
    x = torch.randn(256, 64, dtype=torch.bfloat16)
    launcher[(1,)](_descriptor(x, 64), 64, BLOCK=16, FLAG=True)
    other = {None: lambda: _descriptor(x, 64),
             "other tensor": lambda: _descriptor(torch.randn_like(x), 64),
             "block": lambda: _descriptor(x, 128),
             "dtype": lambda: _descriptor(x.half(), 64),
             "layout": lambda: _descriptor(x, 64, swizzle=64)}[change]()
    launcher[(1,)](other, 64, BLOCK=16, FLAG=True)
    compiled_again = change in ("block", "dtype", "layout")
    assert len(launcher.kernel.jit_launches) == 1 + compiled_again
