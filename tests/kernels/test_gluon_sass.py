"""scripts/gluon_sass.py: one fingerprint of each Gluon kernel's sm90a SASS per configuration,
compared line by line across trees; a kernel that does not compile is an error line, never a
stale fingerprint."""

import importlib.util

import pytest

from support.checkout import ROOT

spec = importlib.util.spec_from_file_location("gluon_sass", ROOT / "scripts" / "gluon_sass.py")
gluon_sass = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gluon_sass)


def test_a_kernel_compiles_to_the_same_fingerprint_twice():
    """Compiled for sm90a here (no GPU), the D kernel's four builds: a count and a SHA-1 each,
    the same from one compile to the next, bf16 and fp16 apart."""
    from cs336_systems.kernels.flash_gluon import compile_for_sm90

    first = gluon_sass.fingerprints(["delta"])
    again = compile_for_sm90("delta", 64, True)
    assert first[0].split()[4:] == [str(again["instructions"]), again["sass_sha1"][:12]]
    assert [line.split()[:4] for line in first] == [
        ["delta", "d64", "causal", "bfloat16"], ["delta", "d64", "causal", "float16"],
        ["delta", "d64", "full", "bfloat16"], ["delta", "d64", "full", "float16"],
        ["delta", "d128", "causal", "bfloat16"], ["delta", "d128", "causal", "float16"],
        ["delta", "d128", "full", "bfloat16"], ["delta", "d128", "full", "float16"]]
    for line in first:
        count, sha = line.split()[4:]
        assert int(count) > 0 and len(sha) == 12 and int(sha, 16) >= 0
    assert first[0].split()[5] != first[1].split()[5]      # bf16 and fp16 differ


@pytest.fixture
def fake_compile(monkeypatch):
    """compile_for_sm90 replaced: every build's SHA-1 is `calls["sha"]`, and a build of `dq`
    raises as a compiler does."""
    from cs336_systems.kernels import flash_gluon

    calls = {"sha": "a" * 40}

    def compile_for_sm90(kernel, d, is_causal, tiles=None, dtype=None):
        if kernel == "dq":
            raise RuntimeError("compiling failed\nAttributeError: no attribute '_flatten_ir'")
        return {"instructions": 100, "sass_sha1": calls["sha"]}
    monkeypatch.setattr(flash_gluon, "compile_for_sm90", compile_for_sm90)
    return calls


def test_compare_says_which_lines_moved(tmp_path, fake_compile, capsys):
    before = tmp_path / "before.txt"
    assert gluon_sass.main(["--kernels", "forward", "--out", str(before)]) == 0
    assert gluon_sass.main(["--kernels", "forward", "--compare", str(before)]) == 0
    assert "the same SASS for every line" in capsys.readouterr().out
    fake_compile["sha"] = "b" * 40
    assert gluon_sass.main(["--kernels", "forward", "--compare", str(before)]) == 1
    out = capsys.readouterr().out
    assert "- forward d64 causal bfloat16 100 aaaaaaaaaaaa\n+ forward d64 causal bfloat16 100 " \
        "bbbbbbbbbbbb" in out


def test_a_kernel_that_does_not_compile_is_an_error_line(fake_compile, capsys):
    assert gluon_sass.main(["--kernels", "dq"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dq d64 causal bfloat16 error: AttributeError: no attribute '_flatten_ir'"
    assert all(" error: " in line for line in lines)


def test_another_triton_site_must_hold_triton(tmp_path):
    with pytest.raises(SystemExit):
        gluon_sass.main(["--triton-site", str(tmp_path)])


def test_gpu_triton_version_is_printed_for_the_setup_script(capsys):
    assert gluon_sass.main(["--gpu-triton-version"]) == 0
    assert capsys.readouterr().out.strip() == gluon_sass.GPU_TRITON
    assert gluon_sass.FINGERPRINTS.is_file()


def _gpu_triton_site():
    """Where the GPU box's Triton is: this machine's own where it is that version (the GPU box
    itself), else GPU_TRITON_SITE where scripts/setup.sh installed it; None where neither."""
    import triton

    if triton.__version__ == gluon_sass.GPU_TRITON:
        return "here"
    site = gluon_sass.GPU_TRITON_SITE
    return site if (site / f"triton-{gluon_sass.GPU_TRITON}.dist-info").is_dir() else None


def test_the_landed_gluon_kernels_are_the_binaries_the_reference_run_measured(capfd):
    """Every Gluon build compiles with the GPU box's Triton, and to the SASS in FINGERPRINTS: a
    kernel edit that Triton rejects fails here, on any machine, and one that changes a binary
    comes with its new lines (`--out`), which say that the measured binaries changed."""
    site = _gpu_triton_site()
    if site is None:
        pytest.skip(f"the GPU box's Triton {gluon_sass.GPU_TRITON} is not in "
                    f"{gluon_sass.GPU_TRITON_SITE} (scripts/setup.sh installs it)")
    compare = ["--compare", str(gluon_sass.FINGERPRINTS)]
    code = gluon_sass.main(compare if site == "here" else ["--triton-site", str(site), *compare])
    out = capfd.readouterr().out        # the child's, under another Triton
    assert code == 0, "\n".join(line for line in out.splitlines()
                                if line.startswith(("-", "+")) or " error: " in line)
