"""Where the package lies: its folder, and the folder holding it (src/), which a job puts on
PYTHONPATH so that the processes it starts run this checkout's code, installed or not; and its
sections, each a folder under sections/ (whose package describes the contract each keeps)."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # .../src/cs336_systems
SRC_ROOT = PACKAGE_DIR.parent

# The writeup's sections, in the order they appear: each is a folder of code
# (sections/<name>/), a rules file (workflow/rules/<name>.smk) and a block of the config.
SECTIONS: tuple[str, ...] = ("benchmark", "profile", "mixed_precision", "memory", "residuals",
                             "checkpointing", "attention", "flash", "training", "distributed",
                             "fsdp", "parallelism", "leaderboard")
