"""eval.judging.menlo_data: the MENLO-format reader, rubric rendering, exemplars, protocol items; the protocol templates."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from eval.judging import menlo_data as md
from eval.judging.menlo_parse import MENLO_LABELS, parse_menlo_grade, parse_menlo_grades
from eval.prompts import load_template, prompt_path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "configs" / "data" / "menlo_fixture.jsonl"
RUBRICS = REPO / "configs" / "data" / "menlo_rubrics.yaml"
GOOD = {"pair_id": "x1", "dimension": "tone", "locale": "de_DE", "prompt": "Hallo?", "response_a": "Hallo!",
        "response_b": "Ja.", "gold_a": 4, "gold_b": 2}


def write_jsonl(tmp_path: Path, records: list, name: str = "m.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_fixture_covers_four_dimensions_and_several_languages():
    pairs = md.read_menlo_jsonl(FIXTURE)
    test = pairs[pairs["split"] == "test"]
    assert set(test["dimension"]) == set(md.DIMENSIONS) and test["locale"].nunique() >= 4
    assert set(pd.concat([test["gold_a"], test["gold_b"]])) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert (test["gold_a"] == test["gold_b"]).any()  # a gold tie, so the tie class of preference is exercised
    assert pairs["pair_id"].is_unique and set(pairs["split"]) == {"train", "test"}


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.pop("gold_b"), "line 2: missing field 'gold_b'"),
    (lambda r: r.update(dimension="style"), "line 2, field 'dimension': 'style' is not one of"),
    (lambda r: r.update(gold_a=6), "line 2, field 'gold_a': grade must be a number in [1, 5], got 6"),
    (lambda r: r.update(gold_a="4"), "field 'gold_a': grade must be a number"),
    (lambda r: r.update(response_b="  "), "line 2, field 'response_b': must be a non-empty string"),
    (lambda r: r.update(split="dev"), "line 2, field 'split': 'dev' is not one of"),
    (lambda r: r.update(pair_id="x1"), "line 2, field 'pair_id': 'x1' already used on line 1"),
])
def test_reader_errors_name_file_line_and_field(tmp_path, edit, message):
    second = dict(GOOD, pair_id="x2")
    edit(second)
    path = write_jsonl(tmp_path, [GOOD, second])
    with pytest.raises(md.MenloDataError) as err:
        md.read_menlo_jsonl(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_reader_rejects_non_json_and_empty_files(tmp_path):
    with pytest.raises(md.MenloDataError, match=r"line 2: not valid JSON"):
        md.read_menlo_jsonl(write_jsonl(tmp_path, [GOOD, "{oops"]))
    with pytest.raises(md.MenloDataError, match="no pairs"):
        md.read_menlo_jsonl(write_jsonl(tmp_path, [""], "empty.jsonl"))


def test_reader_defaults_and_gold_rounding(tmp_path):
    pairs = md.read_menlo_jsonl(write_jsonl(tmp_path, [dict(GOOD, gold_a=3.5)]))
    row = pairs.iloc[0]
    assert (row["template_id"], row["split"], row["question_type"], row["gold_a"]) == ("x1", "test", "", 3.5)
    assert md.gold_class(row["gold_a"]) == 4  # averaged ratings round half up to a class


def test_criteria_with_and_without_rubric():
    rubric = md.load_rubrics(RUBRICS)["localized_tone"]
    full, labels = md.render_criteria(rubric, True), md.render_criteria(rubric, False)
    assert full.startswith("Definition: Alignment with cultural") and full.count("\n* ") >= 5
    assert labels == "### Grading Criteria:\n" + "\n".join(f"{k} - {v}" for k, v in MENLO_LABELS.items())


def test_rubric_file_errors_name_the_key(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(RUBRICS.read_text().replace("    5:\n", "    6:\n", 1))
    with pytest.raises(md.MenloDataError, match=r"r\.yaml: fluency\.criteria must have the keys 1, 2, 3, 4, 5"):
        md.load_rubrics(bad)


def test_exemplars_cover_the_three_buckets_and_skip_the_items_group():
    pairs = md.read_menlo_jsonl(FIXTURE)
    pool = md.exemplar_pool(pairs)
    picked = md.pick_exemplars(pool, "fluency", exclude_template="flu-commute", seed=0)
    assert [e["grade"] for e in picked][1] == 3 and picked[0]["grade"] in (1, 2) and picked[2]["grade"] in (4, 5)
    assert all(e["dimension"] == "fluency" and e["template_id"] != "flu-commute" for e in picked)
    # only the train pairs as pool: fluency's single 3 is in flu-commute, so excluding that group must fail loudly
    train = md.exemplar_pool(pairs[pairs["split"] == "train"])
    with pytest.raises(md.MenloDataError, match="no exemplar graded 3 for dimension 'fluency'"):
        md.pick_exemplars(train, "fluency", exclude_template="flu-commute", seed=0)


def test_items_per_protocol_and_original_identity():
    pairs = md.read_menlo_jsonl(FIXTURE)
    test, pool = pairs[pairs["split"] == "test"].head(8), md.exemplar_pool(pairs[pairs["split"] == "train"])
    protocols = [md.Protocol("point", "pointwise"), md.Protocol("few", "pointwise", rubric=False, fewshot=True),
                 md.Protocol("pair"), md.Protocol("pair1", both_orders=False)]
    items = md.build_items(test, pool, protocols, md.load_rubrics(RUBRICS), seed=0)
    counts = items.groupby("protocol").size().to_dict()
    assert counts == {"point": 16, "few": 16, "pair": 16, "pair1": 8}  # 8 pairs: 2 responses / 2 orders / 1 order
    assert set(items.loc[items["protocol"] == "pair1", "unit"]) == {"AB", "BA"}  # seeded, not always AB
    assert items["item_id"].is_unique
    row = items[(items["protocol"] == "pair") & (items["unit"] == "BA")].iloc[0]
    pair = test.set_index("pair_id").loc[row["pair_id"]]
    user = json.loads(row["messages_json"])[-1]["content"]
    # shown A is the original B in the BA order
    assert user.index(pair["response_b"]) < user.index(pair["response_a"])
    few = json.loads(items[items["protocol"] == "few"]["messages_json"].iloc[0])[0]["content"]
    assert few.count("[Example ") == 3 and "* " not in few  # labels-only criteria, exemplars present
    assert md.to_original("BA", 2, 5) == (5, 2) and md.to_original("a", 3, None) == (3, None)


@pytest.mark.parametrize("name, parse, tags", [
    ("menlo_pairwise", parse_menlo_grades, ("final_grade_A", "final_grade_B")),
    ("menlo_pointwise", parse_menlo_grade, ("final_grade",)),
    ("menlo_pointwise_fewshot", parse_menlo_grade, ("final_grade",)),
    ("menlo_pairwise_fewshot", parse_menlo_grades, ("final_grade_A", "final_grade_B")),
])
def test_instructed_output_format_is_what_the_shared_parser_accepts(name, parse, tags):
    system = load_template(prompt_path(name)).messages[0]["content"]
    instructed = system[system.index("<think> Your analysis"):]
    assert instructed.count("FINAL GRADE: k - LABEL") == len(tags)
    for k, label in MENLO_LABELS.items():
        grades = parse(instructed.replace("k - LABEL", f"{k} - {label}"))
        assert (grades.grade_a, grades.format_ok, grades.error) == (k, True, "")


def test_protocol_validation_names_the_key():
    md.Protocol("x", "pairwise", fewshot=True).validate("protocols.2")  # menlo_pairwise_fewshot
    with pytest.raises(ValueError, match=r"protocols\.2\.template: 'menlo_pairwise' has no 'examples'"):
        md.Protocol("x", "pairwise", fewshot=True, template="menlo_pairwise").validate("protocols.2")
    with pytest.raises(ValueError, match=r"protocols\.0\.template: 'menlo_pointwise' has no 'response_a'"):
        md.Protocol("x", "pairwise", template="menlo_pointwise").validate("protocols.0")


def test_fewshot_pairwise_items_show_a_win_a_tie_and_a_loss_that_parse():
    pairs = md.read_menlo_jsonl(FIXTURE)
    test = pairs[pairs["split"] == "test"].head(2)
    # the fixture's train pairs have no tie: three hand-made exemplar pairs per judged dimension
    rows = []
    for dim in set(test["dimension"]):
        for k, (ga, gb) in enumerate(((4.0, 2.0), (3.0, 3.0), (1.0, 5.0))):
            rows.append({"pair_id": f"ex-{dim}-{k}", "dimension": dim, "template_id": f"ex-{k}", "prompt": f"Q{k}",
                         "response_a": f"A{k}", "response_b": f"B{k}", "gold_a": ga, "gold_b": gb})
    pool = md.exemplar_pool(pd.DataFrame(rows))
    items = md.build_items(test, pool, [md.Protocol("pair-few", "pairwise", fewshot=True)],
                           md.load_rubrics(RUBRICS), seed=0)
    assert len(items) == 4  # 2 pairs x both orders
    system = json.loads(items["messages_json"].iloc[0])[0]["content"]
    assert system.count("[Example ") == 3
    shown = system[system.index("[Example 1]"):system.index("First reason")]
    # each exemplar's grade blocks are what the judge's own parser reads
    for k, (ga, gb) in enumerate(((4, 2), (3, 3), (1, 5))):
        block = shown.split(f"[Example {k + 1}]")[1].split("[Example")[0]
        grades = parse_menlo_grades("<think> x </think>" + block[block.index("<final_grade_A>"):])
        assert (grades.grade_a, grades.grade_b, grades.error) == (ga, gb, "")


def test_pair_exemplar_buckets_by_hand():
    pool = md.exemplar_pool(pd.DataFrame({
        "pair_id": ["p1", "p2", "p3", "p4"], "dimension": ["tone"] * 4, "template_id": ["t1", "t2", "t3", "t4"],
        "prompt": ["q1", "q2", "q3", "q4"], "response_a": ["a1", "a2", "a3", "a4"],
        "response_b": ["b1", "b2", "b3", "b4"], "gold_a": [5.0, 2.0, 3.0, 1.0], "gold_b": [1.0, 2.4, 4.0, 1.0]}))
    # p1: A higher; p2: 2 vs round(2.4) = 2, a tie; p3: B higher; p4: a tie too
    picked = md.pick_pair_exemplars(pool, "tone", exclude_template="t4", seed=0)
    assert [(p["prompt"], p["grade_a"], p["grade_b"]) for p in picked] == [("q1", 5, 1), ("q2", 2, 2), ("q3", 3, 4)]
    with pytest.raises(md.MenloDataError, match="no exemplar pair with B higher for dimension 'tone'"):
        md.pick_pair_exemplars(pool, "tone", exclude_template="t3", seed=0)
