"""The conda environment every rule names (workflow/envs/cs336.yaml) against the tested path,
scripts/setup.sh and pyproject.toml: the same pins, so a cluster run with
`--software-deployment-method conda` gets the software the tests ran with."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _env_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "workflow/envs/cs336.yaml").read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    return pip


def test_env_pins_torch_as_setup_does():
    default = re.search(r'torch==\$\{TORCH_VERSION:-([^}]+)\}',
                        (ROOT / "scripts/setup.sh").read_text()).group(1)
    assert f"torch=={default}" in _env_pip()


def test_env_holds_exactly_the_packages_setup_installs():
    """setup.sh installs `.[test,slurm]`: the dependencies and those two extras; the env holds
    the same requirement strings (torch pinned as above instead of its range)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"],
              *project["optional-dependencies"]["slurm"]]
    wanted = [r for r in dict.fromkeys(wanted) if not r.startswith("torch")]
    assert sorted(r for r in _env_pip() if not r.startswith("torch==")) == sorted(wanted)


def test_setup_installs_test_and_slurm_extras():
    assert '-e ".[test,slurm]"' in (ROOT / "scripts/setup.sh").read_text()


@pytest.mark.pipeline
def test_snakemake_lint_is_clean():
    """`snakemake --lint` reports nothing: every rule has a log and a software environment."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr, (
        out.stdout + out.stderr)[-3000:]
