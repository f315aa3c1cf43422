"""Every problem of the assignment (both editions, by the assignment's names) and its status in
a run: the table the writeup opens with.

A section's report module claims problems in its facts (`facts["coverage"]`, made with
`cs336_systems.report.facts.covered`); a problem that no section claims is "not implemented
yet". Nothing is silent: a problem is answered (a link to its section), partly answered,
skipped or failed (with the reasons, from the records), or not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    name: str       # the assignment's own name (a grader searches for it)
    part: str       # where ../shared/ASSIGNMENT.md puts it
    edition: str    # "2025", "2026" or "both"

    @property
    def key(self) -> str:
        """Unique among the problems (the two leaderboards share a name)."""
        return f"{self.name} ({self.edition})" if self.name == "leaderboard" else self.name


PROBLEMS: tuple[Problem, ...] = (
    Problem("benchmarking_script", "1.1", "both"),
    Problem("nsys_profile", "1.2", "both"),
    Problem("mixed_precision_accumulation", "1.3", "both"),
    Problem("benchmarking_mixed_precision", "1.4", "both"),
    Problem("memory_profiling", "1.5", "both"),
    Problem("autograd_residuals", "2", "2026"),
    Problem("gradient_checkpointing", "2", "2026"),
    Problem("pytorch_attention", "3.1", "both"),
    Problem("torch_compile", "3.2", "both"),
    Problem("weighted_sum", "4.1", "both"),
    Problem("flash_forward", "4.2", "both"),
    Problem("flash_backward", "4.3", "both"),
    Problem("flash_benchmarking", "4.4", "both"),
    Problem("leaderboard", "4.5", "2025"),
    Problem("distributed_communication_single_node", "5.1", "both"),
    Problem("naive_ddp", "5.2", "both"),
    Problem("naive_ddp_benchmarking", "5.2", "both"),
    Problem("minimal_ddp_flat_benchmarking", "5.2", "both"),
    Problem("ddp_overlap_individual_parameters", "5.3", "both"),
    Problem("ddp_overlap_individual_parameters_benchmarking", "5.3", "both"),
    Problem("ddp_overlap_bucketed", "5.4", "2025"),
    Problem("ddp_bucketed_benchmarking", "5.4", "2025"),
    Problem("communication_accounting", "5.5", "2025"),
    Problem("optimizer_state_sharding", "6.1", "both"),
    Problem("optimizer_state_sharding_accounting", "6.1", "both"),
    Problem("fsdp", "6.2", "2026"),
    Problem("fsdp_accounting", "6.2", "2026"),
    Problem("alternate_ring_all_reduce", "7", "2026"),
    Problem("data_parallel_calcs", "7", "2026"),
    Problem("fsdp_calcs", "7", "2026"),
    Problem("tp_calcs", "7", "2026"),
    Problem("fsdp_tp_calcs", "7", "2026"),
    Problem("leaderboard", "8", "2026"),
)
PROBLEM_KEYS = tuple(p.key for p in PROBLEMS)
STATUSES = ("answered", "partly answered", "skipped", "failed", "not implemented yet")


def coverage_rows(claims: dict[str, dict]) -> list[dict]:
    """One row per problem, in the assignment's order: `claims` maps a problem key to what a
    section's facts say of it ({"status", "note", "anchor", "section"})."""
    unknown = sorted(set(claims) - set(PROBLEM_KEYS))
    if unknown:
        raise ValueError(f"sections claim problems the assignment does not have: {unknown}; "
                         f"known: {', '.join(PROBLEM_KEYS)}")
    rows = []
    for problem in PROBLEMS:
        claim = claims.get(problem.key, {"status": "not implemented yet", "note": ""})
        if claim["status"] not in STATUSES:
            raise ValueError(f"{problem.key}: status {claim['status']!r}; allowed: {STATUSES}")
        rows.append({"problem": problem.name, "part": problem.part, "edition": problem.edition,
                     **claim})
    return rows
