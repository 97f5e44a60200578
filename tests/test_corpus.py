"""Tests for actors/corpus.py: generic readers, standard data sets, ratings, filtering and the demo corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors.corpus import (
    CorpusError,
    read_asset,
    read_cord,
    read_corpus,
    read_standard,
    read_turkcorpus,
    source_filter,
)
from actors.ratings import read_asset_ratings, read_simpeval

DEMO = Path(__file__).resolve().parents[1] / "configs" / "data"
ROWS = [
    {"text": "The committee postponed its decision until further evidence arrived.", "year": 2001, "tags": ["a"]},
    {"text": "Bees pollinate many crops.", "year": 2002, "tags": []},
    {"text": "The tenant remains liable for damage caused by negligence.", "year": 2003, "tags": ["b", "c"]},
    {"text": "Rates rose.", "year": 2004, "tags": ["d"]},
]
RATINGS_HEADER = "original,simplification,original_sentence_id,aspect,worker_id,rating\n"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- round trips


def test_jsonl_round_trip_generates_stem_line_ids_and_keeps_other_columns(tmp_path):
    frame = read_corpus(write_jsonl(tmp_path / "toy.jsonl", ROWS))
    assert list(frame.columns) == ["id", "source", "year", "tags"]
    assert list(frame["id"]) == ["toy-000000", "toy-000001", "toy-000002", "toy-000003"]
    assert list(frame["source"]) == [row["text"] for row in ROWS]
    assert list(frame["year"]) == [2001, 2002, 2003, 2004]
    assert list(frame["tags"][2]) == ["b", "c"]


def test_csv_round_trip_keeps_texts_as_strings(tmp_path):
    rows = [{"body": "NA", "score": 1.5}, {"body": "42", "score": 2.0}, {"body": "A long sentence.", "score": 3.0}]
    path = tmp_path / "toy.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    frame = read_corpus(path, text_column="body")
    assert list(frame["source"]) == ["NA", "42", "A long sentence."]  # CSV has no types: texts stay text
    assert list(frame["score"]) == [1.5, 2.0, 3.0]
    assert list(frame["id"]) == ["toy-000000", "toy-000001", "toy-000002"]


def test_parquet_round_trip_with_id_column(tmp_path):
    path = tmp_path / "toy.parquet"
    pq.write_table(pa.table({"uid": [7, 8, 9], "text": ["one two", "three four", "five six"], "n": [1, 2, 3]}), path)
    frame = read_corpus(path, id_column="uid")
    assert list(frame.columns) == ["id", "source", "n"]
    assert list(frame["id"]) == ["7", "8", "9"]
    assert list(frame["n"]) == [1, 2, 3]


# ----------------------------------------------------------------------------- stable ids and windows


def test_ids_are_stable_across_reads_and_windows(tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS)
    full = read_corpus(path)
    assert list(read_corpus(path)["id"]) == list(full["id"])
    window = read_corpus(path, offset=1, limit=2)
    assert list(window["id"]) == ["toy-000001", "toy-000002"]
    assert list(window["source"]) == list(full["source"][1:3])
    assert list(read_corpus(path, offset=3, limit=10)["id"]) == ["toy-000003"]


def test_blank_jsonl_lines_are_skipped_but_ids_follow_physical_lines(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    frame = read_corpus(path)
    assert list(frame["id"]) == ["gaps-000000", "gaps-000002"]
    assert list(read_corpus(path, offset=1)["id"]) == ["gaps-000002"]


def test_offset_past_end_and_bad_window_raise(tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS)
    with pytest.raises(CorpusError, match=r"toy\.jsonl: offset 4 is past the end of the corpus \(4 rows\)"):
        read_corpus(path, offset=4)
    with pytest.raises(ValueError, match="limit"):
        read_corpus(path, limit=0)


def test_duplicate_ids_are_named_with_both_lines(tmp_path):
    rows = [{"id": "a", "text": "x y"}, {"id": "b", "text": "x y"}, {"id": "a", "text": "x z"}]
    path = write_jsonl(tmp_path / "dups.jsonl", rows)
    with pytest.raises(CorpusError, match=r"dups\.jsonl: 1 duplicate id\(s\): 'a' \(line 1 and line 3\)"):
        read_corpus(path, id_column="id")


def test_existing_id_column_without_id_column_argument_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "ided.jsonl", [{"id": "a", "text": "x y"}])
    with pytest.raises(CorpusError, match="pass id_column='id'"):
        read_corpus(path)
    assert list(read_corpus(path, id_column="id")["id"]) == ["a"]


# ----------------------------------------------------------------------------- errors


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    lines = [json.dumps(ROWS[0]), json.dumps(ROWS[1]), '{"text": "unterminated', json.dumps(ROWS[3])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"broken\.jsonl: line 3: not valid JSON: Unterminated string"):
        read_corpus(path)
    # the broken line lies outside the window, so reading the first two rows works
    assert len(read_corpus(path, limit=2)) == 2


def test_jsonl_line_that_is_not_an_object_is_rejected(tmp_path):
    path = tmp_path / "array.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"array\.jsonl: line 2: expected a JSON object, got list"):
        read_corpus(path)


@pytest.mark.parametrize("bad_text", ["", "   ", None, 12])
def test_empty_or_non_string_text_names_the_line(tmp_path, bad_text):
    path = write_jsonl(tmp_path / "texts.jsonl", [ROWS[0], {"text": bad_text}])
    with pytest.raises(CorpusError, match=r"texts\.jsonl: line 2: text column 'text' must be a non-empty string"):
        read_corpus(path)


def test_csv_error_reports_physical_line_after_multiline_field(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text('text,n\n"first line\nsecond line",1\n"",2\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"multi\.csv: line 4: text column 'text'"):
        read_corpus(path)


@pytest.mark.parametrize(
    "name, content",
    [("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n"), ("header.csv", "text,n\n"), ("nothing.csv", "")],
)
def test_empty_corpus_raises_is_empty(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"{name} is empty"):
        read_corpus(path)


def test_empty_parquet_raises_is_empty(tmp_path):
    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    with pytest.raises(CorpusError, match=r"none\.parquet is empty"):
        read_corpus(path)


def test_missing_text_column_names_column_file_and_found_columns(tmp_path):
    path = write_jsonl(tmp_path / "cols.jsonl", [{"sentence": "x y", "lang": "en"}])
    expected = r"cols\.jsonl: text column 'text' not found; columns are \['sentence', 'lang'\]"
    with pytest.raises(CorpusError, match=expected):
        read_corpus(path)


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(CorpusError, match=r"nope\.jsonl: file not found"):
        read_corpus(tmp_path / "nope.jsonl")
    path = tmp_path / "corpus.txt"
    path.write_text("hello\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"corpus\.txt: format 'auto' \(extension '\.txt'\)"):
        read_corpus(path)


# ----------------------------------------------------------------------------- line-aligned data sets


def test_turkcorpus_tune_has_2000_sources_with_8_references(shared_data):
    frame = read_turkcorpus(shared_data / "turkcorpus")
    assert len(frame) == 2000
    assert frame["id"][0] == "turk-tune-000000" and frame["id"][1999] == "turk-tune-001999"
    assert frame["source"][1] == "a georgian inscription around the drum attests his name ."
    assert all(len(refs) == 8 for refs in frame["references"])
    assert frame["references"][1][0] == "there is a georgian inscription around the drum to confirm his name ."


def test_asset_valid_has_2000_sources_with_10_references(shared_data):
    frame = read_asset(shared_data / "asset")
    assert len(frame) == 2000
    assert frame["source"][0].startswith("Adjacent counties are Marin (to the south), Mendocino (to the north)")
    assert all(len(refs) == 10 for refs in frame["references"])
    window = read_asset(shared_data / "asset", offset=1, limit=1)
    assert list(window["id"]) == ["asset-valid-000001"]
    assert window["source"][0] == "A Georgian inscription around the drum attests his name."


def test_misaligned_reference_file_names_file_and_counts(tmp_path):
    (tmp_path / "tune.8turkers.tok.norm").write_text("a b\nc d\ne f\n", encoding="utf-8")
    for k in range(8):
        lines = "a\nc\n" if k == 5 else "a\nc\ne\n"
        (tmp_path / f"tune.8turkers.tok.turk.{k}").write_text(lines, encoding="utf-8")
    with pytest.raises(CorpusError, match=r"tune\.8turkers\.tok\.turk\.5 has 2 lines but .*norm has 3"):
        read_turkcorpus(tmp_path)


def test_empty_reference_line_is_named(tmp_path):
    (tmp_path / "asset.valid.orig").write_text("a b\nc d\n", encoding="utf-8")
    for k in range(10):
        lines = "a\n \n" if k == 9 else "a\nc\n"
        (tmp_path / f"asset.valid.simp.{k}").write_text(lines, encoding="utf-8")
    with pytest.raises(CorpusError, match=r"asset\.valid\.simp\.9: line 2 is empty"):
        read_asset(tmp_path)


# ----------------------------------------------------------------------------- ratings


def test_asset_ratings_real_file(shared_data):
    frame = read_asset_ratings(shared_data / "asset" / "human_ratings.csv")
    assert len(frame) == 4500
    assert frame["aspect"].value_counts().to_dict() == {"meaning": 1500, "fluency": 1500, "simplicity": 1500}
    assert frame["rating"].between(0, 100).all()
    assert frame["original_sentence_id"].dtype.kind == "i" and frame["worker_id"].dtype.kind == "i"
    assert frame.attrs["missing_ratings"] == 0


def test_simpeval_real_file(shared_data):
    frame = read_simpeval(shared_data / "simpeval" / "simpeval_2022.csv")
    assert len(frame) == 360
    assert set(frame["system"].value_counts()) == {60}  # 6 systems x 60 sentences
    assert frame["original_id"].nunique() == 60
    assert frame[["rating_1", "rating_2", "rating_3"]].stack().between(0, 100).all()
    assert frame.attrs["missing_ratings"] == 0


def test_ratings_missing_column_is_named(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("original,simplification,original_sentence_id,aspect,rating\nA b.,A.,1,meaning,50\n")
    with pytest.raises(CorpusError, match=r"ratings\.csv: missing column\(s\) \['worker_id'\]"):
        read_asset_ratings(path)


def test_ratings_non_numeric_rating_names_column_and_line(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text(RATINGS_HEADER + "A b.,A.,1,meaning,3,50\nA b.,A.,1,fluency,3,high\n")
    with pytest.raises(CorpusError, match=r"ratings\.csv: line 3, column 'rating': non-numeric value 'high'"):
        read_asset_ratings(path)


def test_ratings_out_of_range_and_bad_aspect_are_named(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text(RATINGS_HEADER + "A b.,A.,1,meaning,3,101\n")
    with pytest.raises(CorpusError, match=r"line 2, column 'rating': value 101.0 outside \[0, 100\]"):
        read_asset_ratings(path)
    path.write_text(RATINGS_HEADER + "A b.,A.,1,clarity,3,10\n")
    with pytest.raises(CorpusError, match=r"line 2, column 'aspect': 'clarity' is not one of"):
        read_asset_ratings(path)


def test_missing_ratings_stay_nan_and_are_counted(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text(RATINGS_HEADER + "A b.,A.,1,meaning,3,\nA b.,A.,1,fluency,4,70\nA b.,A.,1,simplicity,5,NaN\n")
    frame = read_asset_ratings(path)
    assert len(frame) == 3  # no row dropped
    assert frame["rating"].isna().tolist() == [True, False, True]
    assert frame.attrs["missing_ratings"] == 2


def test_simpeval_bad_rating_names_column_and_line(tmp_path):
    path = tmp_path / "simpeval.csv"
    header = "original_id,original,generation,system,sentence_type,rating_1,rating_2,rating_3\n"
    path.write_text(header + '1,"A, b.",A.,T5-3B,Paraphrases,50,60,70\n2,C d.,C.,Muss,Deletions,50,?,70\n')
    with pytest.raises(CorpusError, match=r"simpeval\.csv: line 3, column 'rating_2': non-numeric value '\?'"):
        read_simpeval(path)


def test_simpeval_unknown_system_names_column_and_line(tmp_path):
    path = tmp_path / "simpeval.csv"
    header = "original_id,original,generation,system,sentence_type,rating_1,rating_2,rating_3\n"
    path.write_text(header + "1,A b.,A.,T5-3B,Paraphrases,50,60,70\n2,C d.,C.,T5-3b,Deletions,50,60,70\n")
    with pytest.raises(CorpusError, match=r"line 3, column 'system': unknown system 'T5-3b'"):
        read_simpeval(path)
    assert list(read_simpeval(path, systems=None)["system"]) == ["T5-3B", "T5-3b"]


# ----------------------------------------------------------------------------- CORD, dispatch, filter


def test_cord_ids_and_sources(shared_data):
    frame = read_cord(shared_data / "cord" / "cord.constraint_2.jsonl")
    assert len(frame) == 100
    assert frame["id"][0] == "cord-c2-000000" and frame["id"][99] == "cord-c2-000099"
    # the text to revise, not the planner prompt around it (eval.craft.cord splits them)
    assert not frame["source"][0].startswith("You are an agent") and frame["level"][0] == 2
    assert all(len(calls) >= 2 for calls in frame["gold_calls"])


def test_read_standard_dispatches_by_kind(tmp_path, shared_data):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS)
    assert list(read_standard("jsonl", path, limit=1)["id"]) == ["toy-000000"]
    assert len(read_standard("turkcorpus", shared_data / "turkcorpus", limit=5)) == 5
    assert len(read_standard("asset", shared_data / "asset", offset=1995)) == 5
    assert len(read_standard("simpeval", shared_data / "simpeval" / "simpeval_2022.csv")) == 360
    cord = read_standard("cord", shared_data / "cord" / "cord.constraint_0.jsonl", limit=2)
    assert list(cord["id"]) == ["cord-c0-000000", "cord-c0-000001"]
    with pytest.raises(CorpusError, match="unknown corpus kind 'tsv'"):
        read_standard("tsv", path)


def test_source_filter_returns_dropped_rows_with_reasons(tmp_path):
    frame = read_corpus(write_jsonl(tmp_path / "toy.jsonl", ROWS))  # word counts: 9, 4, 9, 2
    kept, dropped = source_filter(frame, min_words=4, max_words=8)
    assert list(kept["id"]) == ["toy-000001"]
    assert list(dropped["id"]) == ["toy-000000", "toy-000002", "toy-000003"]
    assert list(dropped["drop_reason"]) == ["9 words > max_words=8", "9 words > max_words=8", "2 words < min_words=4"]
    kept, dropped = source_filter(frame, min_words=3)
    assert len(kept) + len(dropped) == len(frame) and list(dropped["id"]) == ["toy-000003"]
    with pytest.raises(ValueError, match="min_words"):
        source_filter(frame, min_words=5, max_words=2)


# ----------------------------------------------------------------------------- demo corpus


def test_demo_corpus_and_references_line_up():
    corpus = read_corpus(DEMO / "demo_corpus.jsonl", id_column="id")
    assert len(corpus) == 40
    assert corpus["source"].map(lambda text: 20 <= len(text.split()) <= 40).all()
    references = [json.loads(line) for line in (DEMO / "demo_references.jsonl").read_text().splitlines()]
    assert [ref["id"] for ref in references] == list(corpus["id"])
    for ref, source in zip(references, corpus["source"]):
        assert len(ref["references"]) == 2 and all(r.strip() and r != source for r in ref["references"])
