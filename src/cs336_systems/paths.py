"""Where the package lies: its folder, and the folder holding it (src/), which a job puts on
PYTHONPATH so that the processes it starts run this checkout's code, installed or not."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # .../src/cs336_systems
SRC_ROOT = PACKAGE_DIR.parent
