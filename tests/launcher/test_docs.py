"""docs/running-optimum-graphcore-code.md lists every shim, every served metric, and exactly the
Optimum Graphcore names that have no equivalent (the compat tables are the source)."""

import re
from pathlib import Path

from optimum_ipu.compat._names import Missing
from optimum_ipu.compat._tables import TABLES
from optimum_ipu.launcher import SHIMS
from optimum_ipu.launcher.metrics import SERVED_METRICS

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "running-optimum-graphcore-code.md").read_text()


def section(title: str) -> str:
    return PAGE.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def first_column_names(table: str) -> set[str]:
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_every_shim_has_a_row():
    assert first_column_names(section("The shims")) == {shim.name for shim in SHIMS}


def test_every_served_metric_has_a_row():
    names = {n for cell in first_column_names(section("Metrics served offline")) for n in cell.split(", ")}
    assert names == set(SERVED_METRICS)


def test_names_without_equivalent_are_exactly_the_missing_entries_of_the_compat_tables():
    missing = {
        name for table in TABLES.values() for name, entry in table.items() if isinstance(entry, Missing)
    }
    assert first_column_names(section("Optimum Graphcore names that still have no equivalent")) == missing
