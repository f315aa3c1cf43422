"""Tables over MAX_SHOWN_ROWS rows leave the text for their CSV (report.tables.long_table and
the `long_table` filter): the text links the CSV and shows the summary its section chose."""

import pandas as pd

from cs336_systems.report.render import long_table as shown
from cs336_systems.report.tables import MAX_SHOWN_ROWS, long_table


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"seq": range(rows), "ms": [1.5 * i for i in range(rows)]})


def test_a_table_of_at_most_the_limit_is_shown_whole(tmp_path):
    table = long_table(_frame(MAX_SHOWN_ROWS), tmp_path / "tables/t.csv", _frame(2))
    assert table["whole"] and table["rows"] == MAX_SHOWN_ROWS
    text = shown(table, tmp_path)
    assert text.count("\n| ") == MAX_SHOWN_ROWS and ".csv" not in text  # rows after the header


def test_a_longer_table_links_its_csv_and_shows_the_summary(tmp_path):
    table = long_table(_frame(MAX_SHOWN_ROWS + 1), tmp_path / "tables/t.csv", _frame(3))
    assert not table["whole"] and table["rows"] == MAX_SHOWN_ROWS + 1
    text = shown(table, tmp_path / "report")
    assert text.startswith(f"_The whole table has {MAX_SHOWN_ROWS + 1} rows; its data are in "
                           "[t.csv](../tables/t.csv)._")
    assert text.count("\n| ") == 1 + 3  # the summary: its header and its rows
    without = shown(long_table(_frame(MAX_SHOWN_ROWS + 1), tmp_path / "t.csv"), tmp_path)
    assert without == (f"_The whole table has {MAX_SHOWN_ROWS + 1} rows; its data are in "
                       "[t.csv](t.csv)._")
