"""The shared fact helpers: verdicts of comparisons and what a section claims of a problem."""

import pandas as pd
import pytest

from cs336_systems.report.coverage import coverage_rows
from cs336_systems.report.facts import covered, reason, speedup

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad shape\n'


def _rows(*statuses):
    messages = {"skipped": "no CUDA here", "error": TRACEBACK, "oom": "CUDA out of memory"}
    return pd.DataFrame({"status": statuses, "message": [messages.get(s, "") for s in statuses]})


def test_speedup_names_the_faster_and_says_when_it_is_noise():
    s = speedup(10.0, 29.0, 1.0, 1.0)
    assert s["ratio"] == pytest.approx(2.9) and s["word"] == "faster" and not s["within_spread"]
    s = speedup(14.0, 10.0, 3.0, 2.0)
    assert s["factor"] == pytest.approx(1.4) and s["word"] == "slower" and s["within_spread"]
    assert speedup(10.0, 20.0)["within_spread"] is None  # no spread recorded
    assert speedup(float("nan"), 1.0) is None and speedup(0.0, 1.0) is None


def test_reason_is_the_exception_of_a_traceback_and_the_first_line_otherwise():
    assert reason(TRACEBACK) == "ValueError: bad shape"
    assert reason("CUDA out of memory. Tried to allocate 2 GiB\nmore") == \
        "CUDA out of memory. Tried to allocate 2 GiB"
    assert reason(None) == "" and reason(float("nan")) == "nan"
    # torch's out-of-memory: the failed allocation and the room, not its advice
    oom = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. "
           "GPU 1 has a total capacity of 139.80 GiB of which 79.00 MiB is free. Including "
           "non-PyTorch memory, this process has 139.71 GiB memory in use. Of the allocated "
           "memory 138.09 GiB is allocated by PyTorch. If reserved but unallocated memory is "
           "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert reason(oom) == ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to "
                           "allocate 256.00 MiB. GPU 1 has a total capacity of 139.80 GiB of "
                           "which 79.00 MiB is free")


@pytest.mark.parametrize("statuses, status", [
    (("ok", "ok"), "answered"),
    (("ok", "oom"), "answered"),            # an out-of-memory is a result
    (("ok", "skipped"), "partly answered"),
    (("ok", "error"), "partly answered"),
    (("skipped", "skipped"), "skipped"),
    (("oom", "error"), "answered"),         # the oom still answers; the error is counted
    (("error", "skipped"), "failed"),
])
def test_covered_status_follows_the_records(statuses, status):
    claim = covered(_rows(*statuses))
    expected = "partly answered" if status == "answered" and "error" in statuses else status
    assert claim["status"] == expected


def test_covered_notes_give_counts_and_reasons():
    claim = covered(_rows("ok", "skipped", "error"), missing="no 4 and 6 processes")
    assert claim["note"] == ("no 4 and 6 processes; 1 of 3 configurations skipped (no CUDA here); "
                             "1 of 3 configurations error (ValueError: bad shape)")
    assert covered(_rows("skipped"))["note"] == "no CUDA here"
    assert covered(None, how="by the tests")["note"] == "by the tests"


def test_every_problem_gets_a_row_and_unknown_claims_are_refused():
    rows = coverage_rows({"benchmarking_script": covered(_rows("ok"))})
    assert rows[0]["problem"] == "benchmarking_script" and rows[0]["status"] == "answered"
    assert all(r["status"] == "not implemented yet" for r in rows[1:])
    with pytest.raises(ValueError, match="the assignment does not have: \\['made_up'\\]"):
        coverage_rows({"made_up": covered()})


def test_what_a_preset_leaves_out_is_named_with_the_writeups_size_names():
    from cs336_systems.report.facts import not_in_preset

    note = not_in_preset({"sizes": (["small", "xl", "2.7b", "10b"], pd.Series(["small"])),
                          "contexts": ([128, 1024], [128, 1024])},
                         more=["", "no cuDNN rows"])
    assert note == "not in this preset: sizes xl-2025, xl, 10B; no cuDNN rows"
    assert not_in_preset({"d": ([16], [16])}, lead="not in this sweep") == ""
