"""Human-rating files: ASSET human ratings and SimpEval 2022 (read-only, pure pandas).

Cells are checked as they are parsed: a missing column, an empty text, a non-numeric or out-of-range rating, or an
unknown aspect/system raises `CorpusError` naming the file, the line and the column. Missing ratings stay NaN
and are counted in ``frame.attrs``, never imputed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from actors.corpus_files import MISSING_TOKENS, check_file, csv_line_number, read_csv_frame
from core.errors import CorpusError
from core.text import is_blank

ASSET_ASPECTS = ("fluency", "meaning", "simplicity")
ASSET_RATING_COLUMNS = ("original", "simplification", "original_sentence_id", "aspect", "worker_id", "rating")
SIMPEVAL_COLUMNS = ("original_id", "original", "generation", "system", "sentence_type",
                    "rating_1", "rating_2", "rating_3")
SIMPEVAL_SYSTEMS = ("GPT-3-zero-shot", "GPT-3-few-shot", "Muss", "T5-3B", "Human 1 Writing", "Human 2 Writing")


def _read_ratings_csv(path, required, texts) -> pd.DataFrame:
    """Read a ratings CSV as strings; check the ``required`` columns exist and ``texts`` cells are non-empty."""
    path = check_file(path)
    frame = read_csv_frame(path, dtype=str)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise CorpusError(f"{path}: missing column(s) {missing}; columns are {list(frame.columns)}")
    if frame.empty:
        raise CorpusError(f"{path} is empty (header only, no rows)")
    for column in texts:
        for row, cell in enumerate(frame[column]):
            if is_blank(cell):
                raise CorpusError(f"{path}: line {csv_line_number(path, row)}, column {column!r}: empty text")
    return frame


def _parse_numbers(frame, column, path, kind="float", low=None, high=None) -> list:
    """Parse a string column to numbers. Missing float cells become NaN; anything else bad raises
    CorpusError naming the file, 1-based line (header = line 1), column and value."""
    values = []
    for row, cell in enumerate(frame[column]):
        text = cell.strip()
        if kind == "float" and text.lower() in MISSING_TOKENS:
            values.append(math.nan)
            continue
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            problem = "missing value" if not text else f"non-numeric value {cell!r}"
            raise CorpusError(f"{path}: line {csv_line_number(path, row)}, column {column!r}: {problem}") from None
        if (low is not None and not value >= low) or (high is not None and not value <= high):
            raise CorpusError(f"{path}: line {csv_line_number(path, row)}, column {column!r}: "
                              f"value {value} outside [{low}, {high}]")
        values.append(value)
    return values


def read_asset_ratings(path) -> pd.DataFrame:
    """Read ASSET ``human_ratings.csv``: 15 crowd ratings (0-100) per pair and aspect.

    Missing ratings stay NaN, never imputed; their count is ``frame.attrs["missing_ratings"]``.

    Returns:
        Rows and columns as in the file; ``original_sentence_id`` and ``worker_id`` as int, ``rating`` float.
    """
    frame = _read_ratings_csv(path, ASSET_RATING_COLUMNS, ("original", "simplification"))
    for row, aspect in enumerate(frame["aspect"]):
        if aspect not in ASSET_ASPECTS:
            raise CorpusError(f"{path}: line {csv_line_number(Path(path), row)}, column 'aspect': "
                              f"{aspect!r} is not one of {list(ASSET_ASPECTS)}")
    for column in ("original_sentence_id", "worker_id"):
        frame[column] = _parse_numbers(frame, column, Path(path), kind="int")
    frame["rating"] = _parse_numbers(frame, "rating", Path(path), low=0, high=100)
    frame.attrs.update(path=str(path), missing_ratings=int(frame["rating"].isna().sum()))
    return frame


def read_simpeval(path, systems: Sequence[str] | None = SIMPEVAL_SYSTEMS) -> pd.DataFrame:
    """Read SimpEval 2022 (Maddela et al., 2023): system outputs with three 0-100 ratings each.

    Missing ratings stay NaN; their count is ``frame.attrs["missing_ratings"]``. ``*_zscore`` columns are
    parsed as floats. A ``system`` outside ``systems`` (the six of SimpEval 2022 by default; None accepts any)
    is an error naming the line: a typo would otherwise become a seventh "system" in every per-system table.

    Returns:
        Rows in file order; ``original_id`` as int, ratings and z-scores as float.
    """
    frame = _read_ratings_csv(path, SIMPEVAL_COLUMNS, ("original", "generation", "system"))
    if systems is not None:
        for row, name in enumerate(frame["system"]):
            if name not in systems:
                raise CorpusError(f"{path}: line {csv_line_number(Path(path), row)}, column 'system': unknown "
                                  f"system {name!r}; expected one of {list(systems)}")
    frame["original_id"] = _parse_numbers(frame, "original_id", Path(path), kind="int")
    for column in ("rating_1", "rating_2", "rating_3"):
        frame[column] = _parse_numbers(frame, column, Path(path), low=0, high=100)
    for column in (c for c in frame.columns if c.endswith("_zscore")):
        frame[column] = _parse_numbers(frame, column, Path(path))
    missing = frame[["rating_1", "rating_2", "rating_3"]].isna().sum().sum()
    frame.attrs.update(path=str(path), missing_ratings=int(missing))
    return frame
