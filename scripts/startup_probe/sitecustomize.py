"""Where a job's start-up goes, measured from outside the code it runs, so that any commit of
this project can be measured the same way (issue 23's before and after).

Put this folder first on PYTHONPATH and set STARTUP_PROBE_LOG to a file: every Python process
started under it (Snakemake's job scripts and the CLIs they run) appends one JSON line at exit:

    {"pid", "argv0", "output", "created", "site", "script_written", "imports": {module: end},
     "cuda_init": [start, end], "measure": [start, end], "exit"}

All times are seconds since the epoch. `created` is when the kernel started the process
(/proc/self/stat, 10 ms resolution), `script_written` the mtime of a Snakemake job script
(when Snakemake dispatched the job), `measure` the call of the experiment's measure function
inside `run_and_record` (either package layout). Summarise with `summarize.py` beside this.
"""

import atexit
import importlib.abc
import json
import os
import sys
import time

LOG = os.environ.get("STARTUP_PROBE_LOG")
WATCHED = ("torch", "triton", "torch._inductor", "torch._dynamo", "cs336_systems")
RECORDS = ("cs336_systems.records", "cs336_systems.pipeline.records")


def _created() -> float:
    """The process's start, as an epoch time: its age from /proc, taken off the clock now."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    return time.time() - age


EVENT = {"pid": os.getpid(), "argv0": sys.argv[0] if sys.argv else "", "imports": {}}


def _patch_records(module) -> None:
    original = module.run_and_record

    def run_and_record(section, config, output, measure, device="auto"):
        def timed(resolved):
            EVENT["measure"] = [time.time(), None]
            try:
                return measure(resolved)
            finally:
                EVENT["measure"][1] = time.time()
        EVENT["output"] = str(output)
        return original(section, config, output, timed, device)

    module.run_and_record = run_and_record


def _patch_cuda(torch) -> None:
    original = torch.cuda._lazy_init

    def lazy_init():
        if "cuda_init" not in EVENT and not torch.cuda.is_initialized():
            start = time.time()
            original()
            EVENT["cuda_init"] = [start, time.time()]
            return None
        return original()

    torch.cuda._lazy_init = lazy_init


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        EVENT["imports"].setdefault(self.name, time.time())
        if self.name in RECORDS:
            _patch_records(module)
        if self.name == "torch":
            _patch_cuda(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WATCHED + RECORDS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def _exit() -> None:
    EVENT["exit"] = time.time()
    main = sys.modules.get("__main__")
    job = getattr(main, "snakemake", None)
    if job is not None and "output" not in EVENT and len(job.output):
        EVENT["output"] = str(job.output[0])
    with open(LOG, "a") as f:
        f.write(json.dumps(EVENT) + "\n")


def _chain() -> None:
    """Run the sitecustomize this one hides (a distribution's own), if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(folder or ".", "sitecustomize.py")
        if os.path.isfile(path) and os.path.dirname(os.path.abspath(path)) != here:
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), {"__name__": "sitecustomize_chained"})
            return


_chain()
if LOG:
    EVENT["created"] = _created()
    EVENT["site"] = time.time()
    if "/.snakemake/scripts/" in EVENT["argv0"]:
        EVENT["script_written"] = os.path.getmtime(EVENT["argv0"])
    sys.meta_path.insert(0, _Finder())
    atexit.register(_exit)
