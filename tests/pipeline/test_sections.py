"""The section recipe of docs/architecture.md, held to the code: each section of SECTIONS is one
folder (its CLIs, report module, template and captions), one rules file and one config block,
and its report module keeps the `SectionReport` contract."""

import inspect
import re

import pytest

from cs336_systems.sections import SECTIONS, Section, SectionReport
from support.checkout import ROOT, project_yaml

RULES = ROOT / "workflow/rules"
CONFIG = project_yaml()
SCHEMA = project_yaml("workflow/schemas/config.schema.yaml")


def _rules(name: str) -> str:
    return Section(name).rules_file(ROOT / "workflow").read_text()


@pytest.mark.parametrize("name", SECTIONS)
def test_a_section_is_one_folder(name):
    section = Section(name)
    for path in (section.folder / "__init__.py", section.folder / "report.py", section.template,
                 section.records_schema, section.rules_file(ROOT / "workflow")):
        assert path.is_file(), path
    assert section.captions.is_dir()
    assert "**tables_inputs(" in _rules(name)  # its records' folders, schemas and code


@pytest.mark.parametrize("name", SECTIONS)
def test_it_describes_the_records_its_jobs_write(name):
    """Each CLI of the section writes records of a kind its records.yaml describes."""
    import re

    import yaml

    kinds = set(yaml.safe_load(Section(name).records_schema.read_text()))
    written = set()
    for cli in Section(name).folder.glob("*.py"):
        written |= set(re.findall(r'run_and_record\(\s*"(\w+)"', cli.read_text()))
    assert written <= kinds, f"{name}: records of kinds {sorted(written - kinds)} undescribed"


@pytest.mark.parametrize("name", SECTIONS)
def test_its_report_module_keeps_the_contract(name):
    module = Section(name).report()
    assert isinstance(module, SectionReport)
    assert list(inspect.signature(module.build).parameters) == ["records", "options", "outputs"]


@pytest.mark.parametrize("name", SECTIONS)
def test_its_rules_file_renders_it_and_runs_its_own_clis(name):
    rules = _rules(name)
    assert re.search(rf'^rule {name}_tables:', rules, re.M)
    assert f'section="{name}"' in rules
    for cli in re.findall(r'cli="([\w.]+)"', rules):
        # a section may run another's CLI (the compiled models are the benchmark's step)
        owner = cli.split(".")[2]
        assert cli.startswith("cs336_systems.sections.") and owner in SECTIONS, cli
        assert (Section(owner).folder / f"{cli.split('.')[-1]}.py").is_file(), cli


@pytest.mark.parametrize("name", SECTIONS)
def test_its_captions_are_its_own_and_each_is_used(name):
    used = set(re.findall(r'caption\("(\w+)"\)', _rules(name)))
    own = {path.stem for path in Section(name).captions.glob("*.rst")}
    assert used == own, f"captions used by {name}.smk: {sorted(used)}; in its folder: {sorted(own)}"


@pytest.mark.parametrize("name", SECTIONS)
def test_its_config_block_is_in_the_defaults_and_the_schema(name):
    assert name in CONFIG["defaults"]
    assert name in SCHEMA["$defs"]["preset"]["properties"]


def test_no_caption_name_stands_in_two_folders():
    names = [path.stem for path in (ROOT / "src/cs336_systems").glob("**/captions/*.rst")]
    assert len(names) == len(set(names))


def test_an_unknown_section_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown section 'nope'; allowed: benchmark, profile"):
        Section("nope")
