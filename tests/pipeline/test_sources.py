"""The source files a rule lists: what its job's module imports from the package, transitively."""

import pytest

from cs336_systems.paths import SRC_ROOT
from cs336_systems.pipeline.sources import module_sources


def _names(*modules):
    return {p.replace("\\", "/").split("src/cs336_systems/")[-1]
            for p in module_sources(*modules, relative_to=SRC_ROOT.parent)}


def test_benchmark_job_depends_on_the_code_it_runs():
    names = _names("cs336_systems.sections.benchmark.time_step")
    assert {"sections/benchmark/time_step.py", "lm/model.py", "lm/attention.py",
            "lm/optimizer.py", "lm/loss.py", "lm/step.py", "measure/timing.py",
            "pipeline/records.py"} <= names
    assert not any(n.startswith("report/") or n.endswith("report.py") for n in names)
    assert "__init__.py" not in names  # re-exports would make everything depend on everything


def test_report_section_does_not_depend_on_the_code_that_measures():
    names = _names("cs336_systems.sections.benchmark.report")
    assert "sections/benchmark/report.py" in names and "report/tables.py" in names
    assert "lm/optimizer.py" not in names and "sections/benchmark/time_step.py" not in names


def test_unknown_module_is_an_error():
    with pytest.raises(ValueError, match="no module 'cs336_systems.nope'"):
        module_sources("cs336_systems.nope")


def test_imports_through_a_package_follow_its_re_exports():
    names = _names("cs336_systems.sections.distributed.time_ddp")
    assert {"distributed/ddp.py", "distributed/naive.py", "lm/model.py"} <= names
    assert "distributed/sharded_optimizer.py" not in names
    assert "distributed/__init__.py" not in names


def test_lazy_exports_lead_to_the_defining_module(tmp_path):
    """`from pkg import name` through a lazy EXPORTS table counts the module defining `name`,
    not the package's other modules."""
    package = tmp_path / "cs336_systems"
    (package / "kit").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kit/__init__.py").write_text(
        'EXPORTS = {"cs336_systems.kit.one": ("a",), "cs336_systems.kit.two": ("b",)}\n')
    (package / "kit/one.py").write_text("a = 1\n")
    (package / "kit/two.py").write_text("b = 2\n")
    (package / "job.py").write_text("from cs336_systems.kit import a\n")
    files = {p.split("cs336_systems/")[-1]
             for p in module_sources("cs336_systems.job", src_root=tmp_path)}
    assert files == {"job.py", "kit/one.py"}
