"""Corpus readers: plain JSONL / CSV / Parquet corpora and the standard simplification data sets.

Every reader returns a pandas DataFrame whose string ``id`` column does not depend on how the file is
windowed (``offset`` / ``limit``), so shards read by different workers join back together. Bad input
raises :class:`CorpusError` naming the file and the line (or row); no row is dropped without a trace.
The module is pure (pandas + pyarrow); the Ray Data wrapping lives elsewhere. Try it::

    python -c "import actors.corpus as c; print(c.read_corpus('configs/data/demo_corpus.jsonl', 'auto', 'text', 'id'))"
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from actors.corpus_files import check_file, csv_line_number, read_csv_frame
from actors.ratings import read_asset_ratings, read_simpeval
from core.errors import CorpusError
from core.files import json_object, read_utf8
from core.text import is_blank, normalise_text

FORMATS_BY_SUFFIX = {".jsonl": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
STANDARD_KINDS = ("jsonl", "parquet", "csv", "turkcorpus", "asset", "asset_ratings", "simpeval", "cord")


# ----------------------------------------------------------------------------- generic corpora


def read_corpus(path, fmt="auto", text_column="text", id_column=None, limit=None, offset=0) -> pd.DataFrame:
    """Read a JSONL, CSV or Parquet corpus into a frame with ``id`` and ``source`` columns.

    Args:
        path: File to read.
        fmt: ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"auto"`` (chosen from the file extension).
        text_column: Column holding the source text; renamed to ``source``.
        id_column: Column holding row ids (converted to ``str``). If None, ids are generated as
            ``<file stem>-<NNNNNN>`` from the 0-based physical line (JSONL) or data row (CSV, Parquet).
        limit: Maximum number of rows to return (None = all).
        offset: Number of rows (blank JSONL lines excluded) to skip first. Ids do not depend on
            ``offset`` or ``limit``; only rows inside the window are parsed and validated.

    Returns:
        DataFrame with columns ``id``, ``source`` and every other column of the file unchanged. ``source`` is the
        text normalised by :func:`core.text.normalise_text` (NFC, no control or zero-width characters); how many
        rows that changed is ``frame.attrs["normalised_rows"]``.

    Raises:
        CorpusError: missing file, unknown format, malformed line (a key twice in one JSON object included),
            missing column, empty or non-string text (empty once normalised included), duplicate ids, or an
            empty corpus.
    """
    path = check_file(path)
    fmt = _resolve_format(path, fmt)
    if fmt == "jsonl":
        raw, positions = _load_jsonl(path, limit, offset)
    elif fmt == "csv":
        raw, positions = _load_csv(path, limit, offset, text_column, id_column)
    else:
        raw, positions = _load_parquet(path, limit, offset)
    return _finish_corpus(raw, positions, path, fmt, text_column, id_column)


def _resolve_format(path: Path, fmt: str) -> str:
    resolved = FORMATS_BY_SUFFIX.get(path.suffix.lower(), "unknown") if fmt == "auto" else fmt
    if resolved not in ("jsonl", "csv", "parquet"):
        raise CorpusError(f"{path}: format {fmt!r} (extension {path.suffix!r}) is not one of jsonl, csv, parquet")
    return resolved


def _slice_window(n_rows: int, limit, offset, path: Path) -> range:
    """Return the rows selected by ``offset``/``limit``; an empty corpus or an offset past the end raise."""
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    if n_rows == 0:
        raise CorpusError(f"{path} is empty (no rows)")
    if offset >= n_rows:
        raise CorpusError(f"{path}: offset {offset} is past the end of the corpus ({n_rows} rows)")
    return range(offset, n_rows if limit is None else min(n_rows, offset + limit))


def _read_lines(path: Path) -> list[str]:
    """Read a UTF-8 text file as lines (without the empty string after a final newline)."""
    text = read_utf8(path, CorpusError)
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _load_jsonl(path: Path, limit, offset) -> tuple[pd.DataFrame, list[int]]:
    """Parse the windowed JSONL records; blank lines are not records but keep the line numbering."""
    lines = _read_lines(path)
    numbers = [i for i, line in enumerate(lines) if line.strip()]
    if not numbers:
        raise CorpusError(f"{path} is empty ({len(lines)} lines, all blank)")
    positions = [numbers[i] for i in _slice_window(len(numbers), limit, offset, path)]
    return pd.DataFrame([_parse_json_line(path, lines[i], i + 1) for i in positions]), positions


def _parse_json_line(path: Path, line: str, number: int) -> dict:
    record = json_object(line, f"{path}: line {number}", CorpusError)
    # the file decoded as UTF-8, so only a "\ud800"-style escape can hold a lone surrogate, which no UTF-8
    # writer (pandas' Arrow strings, Parquet, HTTP) accepts
    if "\\u" in line and not _is_utf8(json.dumps(record, ensure_ascii=False)):
        raise CorpusError(f"{path}: line {number}: a string holds a lone surrogate escape (e.g. \\ud800), "
                          "which is not encodable as UTF-8")
    return record


def _load_csv(path: Path, limit, offset, text_column, id_column) -> tuple[pd.DataFrame, list[int]]:
    """Read a CSV corpus. Only empty cells become NaN; text and id cells are read as strings."""
    str_columns = {name: str for name in (text_column, id_column) if name is not None}
    frame = read_csv_frame(path, na_values=[""], dtype=str_columns)
    window = _slice_window(len(frame), limit, offset, path)
    return frame.iloc[window.start:window.stop].reset_index(drop=True), list(window)


def _load_parquet(path: Path, limit, offset) -> tuple[pd.DataFrame, list[int]]:
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several unrelated types for a broken file
        raise CorpusError(f"{path}: cannot read Parquet: {err}") from err
    window = _slice_window(table.num_rows, limit, offset, path)
    return table.slice(window.start, len(window)).to_pandas(), list(window)


def _place(path: Path, fmt: str, position: int) -> str:
    """Return ``"line N"`` (JSONL, CSV) or ``"row N"`` (Parquet), 1-based, for the 0-based ``position``."""
    if fmt == "jsonl":
        return f"line {position + 1}"
    if fmt == "csv":
        return f"line {csv_line_number(path, position)}"
    return f"row {position + 1}"


def _finish_corpus(raw, positions, path, fmt, text_column, id_column) -> pd.DataFrame:
    """Validate columns, texts and ids, then assemble the ``id, source, ...`` frame."""
    found = list(raw.columns)
    for name, role in ((text_column, "text"), (id_column, "id")):
        if name is not None and name not in found:
            raise CorpusError(f"{path}: {role} column {name!r} not found; columns are {found}")
    if id_column is None and "id" in found:
        raise CorpusError(f"{path} already has an 'id' column; pass id_column='id' to use it")
    if text_column != "source" and "source" in found:
        raise CorpusError(f"{path} has a 'source' column besides text column {text_column!r}; rename one")
    for position, text in zip(positions, raw[text_column]):
        if not isinstance(text, str) or is_blank(text):
            raise CorpusError(f"{path}: {_place(path, fmt, position)}: text column {text_column!r} "
                              f"must be a non-empty string, got {text!r}{_invisible(text)}")
    sources = [normalise_text(text) for text in raw[text_column]]
    ids = [f"{path.stem}-{position:06d}" for position in positions]
    if id_column is not None:
        ids = [_format_id(value, path, fmt, position) for position, value in zip(positions, raw[id_column])]
    _check_unique(ids, positions, path, fmt)
    rest = raw.drop(columns=[c for c in (text_column, id_column) if c is not None])
    out = pd.concat([pd.DataFrame({"id": ids, "source": sources}), rest], axis=1)
    out.attrs["path"] = str(path)
    out.attrs["normalised_rows"] = sum(a != b for a, b in zip(sources, raw[text_column]))
    return out


def _invisible(text) -> str:
    """The hint for a text that looks non-empty but holds only zero-width / control characters."""
    return " (only zero-width or control characters)" if isinstance(text, str) and text.strip() else ""


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _format_id(value, path: Path, fmt: str, position: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
        raise CorpusError(f"{path}: {_place(path, fmt, position)}: empty id {value!r}")
    return str(value)


def _check_unique(ids: list[str], positions: list[int], path: Path, fmt: str) -> None:
    """Raise CorpusError naming up to five duplicated ids with the lines of both occurrences."""
    first: dict[str, int] = {}
    clashes = []
    for id_, position in zip(ids, positions):
        if id_ in first:
            clashes.append((id_, first[id_], position))
        first.setdefault(id_, position)
    if clashes:
        shown = [f"{i!r} ({_place(path, fmt, a)} and {_place(path, fmt, b)})"
                 for i, a, b in clashes[:5]]
        raise CorpusError(f"{path}: {len(clashes)} duplicate id(s): {'; '.join(shown)}")


# ----------------------------------------------------------------------------- line-aligned data sets


def _read_aligned(source: Path, references: list[Path]) -> tuple[list[str], list[list[str]]]:
    """Read a source file and its line-aligned reference files; counts must match, lines be non-empty."""
    columns = []
    for path in [source, *references]:
        lines = _read_lines(check_file(path))
        if columns and len(lines) != len(columns[0]):
            raise CorpusError(f"{path} has {len(lines)} lines but {source} has {len(columns[0])}")
        for number, line in enumerate(lines, start=1):
            if is_blank(line):
                raise CorpusError(f"{path}: line {number} is empty{_invisible(line)}")
        columns.append([normalise_text(line) for line in lines])
    return columns[0], [list(refs) for refs in zip(*columns[1:])]


def _build_reference_frame(prefix, source, references, limit, offset) -> pd.DataFrame:
    """Read the aligned files and return the windowed ``id, source, references`` frame."""
    sources, refs = _read_aligned(source, references)
    window = _slice_window(len(sources), limit, offset, source)
    return pd.DataFrame({
        "id": [f"{prefix}-{i:06d}" for i in window],
        "source": [sources[i] for i in window],
        "references": [refs[i] for i in window],
    })


def read_turkcorpus(directory, split="tune", limit=None, offset=0) -> pd.DataFrame:
    """Read TurkCorpus (Xu et al., 2016): tokenized, lowercased sources with 8 lexical references each.

    Reads ``<directory>/<split>.8turkers.tok.norm`` and the line-aligned ``.turk.{0..7}``; ``limit`` and
    ``offset`` window the rows as in :func:`read_corpus`.

    Returns:
        DataFrame with ``id`` (``turk-<split>-000000``), ``source`` and ``references`` (list of 8 str).
    """
    stem = Path(directory) / f"{split}.8turkers.tok"
    refs = [Path(f"{stem}.turk.{k}") for k in range(8)]
    return _build_reference_frame(f"turk-{split}", Path(f"{stem}.norm"), refs, limit, offset)


def read_asset(directory, split="valid", limit=None, offset=0) -> pd.DataFrame:
    """Read ASSET (Alva-Manchego et al., 2020): untokenized sources with 10 multi-operation references.

    Reads ``<directory>/asset.<split>.orig`` and the line-aligned ``.simp.{0..9}``; ``limit`` and
    ``offset`` window the rows as in :func:`read_corpus`.

    Returns:
        DataFrame with ``id`` (``asset-<split>-000000``), ``source`` and ``references`` (list of 10 str).
    """
    stem = Path(directory) / f"asset.{split}"
    refs = [Path(f"{stem}.simp.{k}") for k in range(10)]
    return _build_reference_frame(f"asset-{split}", Path(f"{stem}.orig"), refs, limit, offset)


# ----------------------------------------------------------------------------- CORD and dispatch


def read_cord(path, limit=None, offset=0) -> pd.DataFrame:
    """A CORD constrained-revision file (paper 002) as a corpus, windowed by ``limit`` / ``offset``.

    `eval.craft.cord` parses and checks every line (the one CORD reader); here each instance becomes a row with ``id``
    (``cord-c2-000007``), ``source`` (the text to revise), ``instruction``, ``level``, ``gold_calls``,
    ``constraints_json`` and ``origin`` (file:line).
    """
    from eval.craft.cord import read_cord as read_cord_rows

    rows = read_cord_rows(path)
    window = _slice_window(len(rows), limit, offset, Path(path))
    frame = pd.DataFrame([rows[i].to_row() for i in window])
    return frame.rename(columns={"source": "origin"}).rename(columns={"text": "source"})


def read_standard(kind, path, **kw) -> pd.DataFrame:
    """Read ``path`` with the reader for ``kind`` (one of ``STANDARD_KINDS``), passing ``kw`` through."""
    if kind in ("jsonl", "parquet", "csv"):
        return read_corpus(path, fmt=kind, **kw)
    if kind == "turkcorpus":
        return read_turkcorpus(path, **kw)
    if kind == "asset":
        return read_asset(path, **kw)
    if kind in ("asset_ratings", "simpeval"):
        return (read_asset_ratings if kind == "asset_ratings" else read_simpeval)(path, **kw)
    if kind == "cord":
        return read_cord(path, **kw)
    raise CorpusError(f"unknown corpus kind {kind!r}; expected one of {list(STANDARD_KINDS)}")


# ----------------------------------------------------------------------------- filtering


def source_filter(df, min_words=8, max_words=None, column="source") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split rows into kept and dropped by whitespace word count (paper 000's heuristic source filter).

    Paper 000 removes "very short source sentences that leave little room for edits" without giving a
    threshold; ``min_words=8`` is our choice (it drops 36 of the 2000 ASSET valid sources).

    Args:
        df: Frame with a text ``column`` (default ``source``).
        min_words: Rows with fewer words are dropped; max_words: rows with more are dropped (None = no bound).

    Returns:
        ``(kept, dropped)`` with fresh indexes; ``dropped`` has an extra ``drop_reason`` column.
    """
    if column not in df.columns:
        raise CorpusError(f"source_filter: column {column!r} not found; columns are {list(df.columns)}")
    if min_words < 0 or (max_words is not None and max_words < min_words):
        raise ValueError(f"need 0 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}")
    counts = df[column].map(lambda text: len(str(text).split()))
    reasons = [f"{n} words < min_words={min_words}" if n < min_words
               else f"{n} words > max_words={max_words}" if max_words is not None and n > max_words
               else "" for n in counts]
    drop = pd.Series([bool(r) for r in reasons], index=df.index)
    kept = df[~drop].reset_index(drop=True)
    dropped = df[drop].reset_index(drop=True).assign(drop_reason=[r for r in reasons if r])
    return kept, dropped
