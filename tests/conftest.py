"""Test-suite set-up: never touch the network, and make `fixtures` and the examples importable."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

# A skip hides a broken test as well as a missing package: CI declares how many skips it expects
# (`OPTIMUM_IPU_MAX_SKIPS` in .ci/run, only for optional third-party packages) and fails above it.
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    limit = os.environ.get("OPTIMUM_IPU_MAX_SKIPS")
    if limit is not None and len(_SKIPPED) > int(limit):
        listing = "\n  ".join(_SKIPPED[:20])
        print(
            f"\n{len(_SKIPPED)} tests skipped, more than the {limit} declared (OPTIMUM_IPU_MAX_SKIPS):\n  {listing}"
        )
        session.exitstatus = 1
