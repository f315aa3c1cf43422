import os
import zlib

import torch

# Without a GPU, Triton kernels run in its interpreter; the variable must be set before triton
# is imported anywhere.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# pytest-xdist gives each worker a core: torch's own threads would oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER") and DEVICE == "cpu":
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """A different, reproducible seed per test: fresh random inputs, never zeros."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under `--dist loadgroup` (pyproject.toml) a test goes to whichever worker is free, except
    that the tests of a module that share a module-scoped fixture (a smoke run, a section's
    tables) stay on one worker, so the fixture runs once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info else ()
        if any(d.scope == "module" for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


_SAVE = None


@pytest.fixture(autouse=True, scope="session")
def _quick_figures():
    """The sections' tests draw every figure, at a tenth of its resolution and without
    `tight_layout` (40% of their time otherwise); the pipeline's tests, which run Snakemake in
    a copy of the checkout, save them as the writeup does."""
    from cs336_systems.report import figures
    global _SAVE
    _SAVE = figures.save

    def save(fig, path):
        path = figures.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=11)
        figures.plt.close(fig)
        return path

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "save", save)
        yield


@pytest.fixture
def real_figures(monkeypatch):
    """For a test that looks at what a figure holds: `figures.save` as the writeup has it."""
    from cs336_systems.report import figures
    monkeypatch.setattr(figures, "save", _SAVE)
