from cs336_systems.sources import SRC_ROOT, module_sources


def _names(*modules):
    return {p.replace("\\", "/").split("src/cs336_systems/")[-1]
            for p in module_sources(*modules, relative_to=SRC_ROOT.parent)}


def test_benchmark_job_depends_on_the_code_it_runs():
    names = _names("cs336_systems.experiments.benchmark")
    assert {"experiments/benchmark.py", "model.py", "attention.py", "optimizer.py", "loss.py",
            "timing.py", "records.py"} <= names
    assert not any(n.startswith("report/") for n in names)
    assert "__init__.py" not in names  # re-exports would make everything depend on everything


def test_report_section_does_not_depend_on_the_code_that_measures():
    names = _names("cs336_systems.report.sections.benchmark")
    assert "report/sections/benchmark.py" in names and "report/tables.py" in names
    assert "optimizer.py" not in names and not any(n.startswith("experiments/") for n in names)


def test_unknown_module_is_an_error():
    import pytest
    with pytest.raises(ValueError, match="no module 'cs336_systems.nope'"):
        module_sources("cs336_systems.nope")


def test_imports_through_a_package_follow_its_re_exports():
    names = _names("cs336_systems.experiments.ddp")
    assert {"distributed/ddp.py", "distributed/naive.py", "model.py"} <= names
    assert "distributed/fsdp.py" not in names and "distributed/sharded_optimizer.py" not in names
    assert "distributed/__init__.py" not in names
