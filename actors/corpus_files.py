"""File checks shared by the corpus readers (`actors.corpus`) and the human-rating readers (`actors.ratings`).

Every error is a `CorpusError` naming the file (and line), so the CLI reports it as bad input (exit 2).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from core.errors import CorpusError

# cell texts that mean "no value" in a ratings CSV (a rating left blank is NaN, never 0)
MISSING_TOKENS = {"", "nan", "na", "n/a", "null", "none"}


def check_file(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    return path


def read_csv_frame(path: Path, **kw) -> pd.DataFrame:
    try:
        return pd.read_csv(path, keep_default_na=False, **kw)
    except pd.errors.EmptyDataError as err:
        raise CorpusError(f"{path} is empty (no header, no rows)") from err
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise CorpusError(f"{path}: malformed CSV: {str(err).strip()}") from err


def csv_line_number(path: Path, row: int) -> int:
    """Return the 1-based physical line where data row ``row`` (0-based) starts; the header is line 1."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        start = 1
        for index, _ in enumerate(reader):
            if index == row + 1:
                return start
            start = reader.line_num + 1
    return start
