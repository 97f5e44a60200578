"""eval.craft.results on a hand-worked results table (two CORD-like instances, three systems)."""

import json
import math

import pandas as pd
import pytest

from eval.craft.results import (
    accuracy_by_level,
    accuracy_by_type,
    calls_per_solved,
    constraint_checks,
    cost_table,
    quality_table,
    sign_test,
    with_copy_floor,
)

A = ("1:1", 1, "The cat sat. It was happy.", [("sentence_count", 'sentence_count_check(1, "equal")')])
B = ("2:1", 2, "A b. C d.", [("sentence_count", 'sentence_count_check(3, "less than")'),
                            ("remove_keyword", 'keyword_keep_removal_check("C", "remove")'),
                            ("word_count", 'word_count_check(9, "less than"); word_count_check(2, "more than")')])


def results():
    rows = []
    revisions = {"direct": {"1:1": A[2], "2:1": "A b. C d."},  # A: 2 sentences (0/1); B: count ok, C kept: 2/3
                 "mcts": {"1:1": "The happy cat sat.", "2:1": "A b. D d."},  # 1/1 and 3/3
                 "agent": {"1:1": "The happy cat sat.", "2:1": "A."}}  # A errored (0); B: "A." < 2 words: 2/3
    calls = {"direct": 1, "mcts": 5, "agent": 3}
    for system, revs in revisions.items():
        for iid, level, text, constraints in (A, B):
            rows.append({"id": iid, "level": level, "system": system, "text": text, "instruction": "Polish.",
                         "revision": revs[iid], "error": "boom" if (system, iid) == ("agent", "1:1") else "",
                         "constraints_json": json.dumps([{"type": t, "call": c} for t, c in constraints]),
                         "llm_calls": calls[system] + (iid == "2:1"), "prompt_tokens": 10, "completion_tokens": 4,
                         "seconds": 0.5})
    return pd.DataFrame(rows)


def test_accuracy_per_level_and_type_hand_worked():
    checks = constraint_checks(results())
    assert len(checks) == 3 * 4
    level = accuracy_by_level(checks, n_boot=200).set_index(["system", "level"])
    assert level.loc[("direct", "C1"), "accuracy"] == 0.0
    assert math.isclose(level.loc[("direct", "C2"), "accuracy"], 2 / 3)
    assert math.isclose(level.loc[("direct", "all"), "accuracy"], 1 / 3)
    assert level.loc[("mcts", "all"), "accuracy"] == 1.0
    assert math.isclose(level.loc[("agent", "all"), "accuracy"], 1 / 3)  # the failed row counts as 0
    # one instance per level: the CI is the point; two instances: the bootstrap spans their values
    assert level.loc[("direct", "C2"), ["ci_low", "ci_high"]].tolist() == [2 / 3, 2 / 3]
    assert math.isclose(level.loc[("direct", "all"), "ci_low"], 0.0)
    assert math.isclose(level.loc[("direct", "all"), "ci_high"], 2 / 3)
    assert list(dict.fromkeys(level.reset_index()["system"])) == ["direct", "agent", "mcts"]
    kind = accuracy_by_type(checks, n_boot=200).set_index(["system", "type"])
    assert kind.loc[("direct", "sentence_count"), "accuracy"] == 0.5
    assert kind.loc[("direct", "remove_keyword"), "accuracy"] == 0.0
    assert kind.loc[("direct", "word_count"), "accuracy"] == 1.0
    assert kind.loc[("agent", "word_count"), "accuracy"] == 0.0  # "A." is not more than 2 words
    assert kind.loc[("mcts", "sentence_count"), "constraints"] == 2


def test_cost_quality_and_calls_per_solved():
    frame = results()
    checks = constraint_checks(frame)
    cost = cost_table(frame).set_index("system")
    assert cost.loc["mcts", "llm_calls"] == 11 and cost.loc["mcts", "llm_calls_per_instance"] == 5.5
    assert cost.loc["agent", "failed"] == 1 and cost.loc["direct", "seconds"] == 1.0
    assert math.isnan(cost.loc["mcts", "llm_calls_vs_iter"])  # no Iter in this table
    # Table 11's "x Iter" form against another system: mcts 5.5 calls / direct 1.5 per instance
    assert math.isclose(cost_table(frame, "direct").set_index("system").loc["mcts", "llm_calls_vs_direct"], 5.5 / 1.5)
    assert calls_per_solved(frame, checks, "mcts") == 5.5  # 11 calls / 2 solved
    assert calls_per_solved(frame, checks, "direct") == math.inf
    q = quality_table(frame, n_boot=100).set_index("system")
    assert q.loc["direct", "quality"] == 100.0  # unchanged copies
    # agent: failed row 0; "A." vs "A b. C d." shares no whitespace token ("A." is not "A"): 0
    assert q.loc["agent", "quality"] == 0.0
    # mcts: "The happy cat sat." vs "The cat sat. It was happy." = 2 * 3 / 10 = 60 ("The", "cat sat.");
    # "A b. D d." vs "A b. C d." = 2 * 3 / 8 = 75; mean 67.5
    assert math.isclose(q.loc["mcts", "quality"], 67.5)


def test_every_table_has_the_copy_the_input_row():
    # wrong result 3's second half: the floor a system must beat is in every table, computed without a model
    frame = with_copy_floor(results())
    copy = frame[frame["system"] == "copy"]
    assert len(copy) == 2 and (copy["revision"] == copy["text"]).all() and (copy["llm_calls"] == 0).all()
    assert with_copy_floor(frame).equals(frame)  # added once
    checks = constraint_checks(frame)
    level = accuracy_by_level(checks, n_boot=100).set_index(["system", "level"])
    # copy = direct here (direct returned both inputs unchanged): A 0/1, B 2/3
    assert math.isclose(level.loc[("copy", "all"), "accuracy"], 1 / 3)
    assert level.reset_index()["system"].iloc[0] == "copy"
    assert quality_table(frame, n_boot=50).set_index("system").loc["copy", "quality"] == 100.0
    assert cost_table(frame).set_index("system").loc["copy", "llm_calls"] == 0


def test_one_tailed_sign_test_hand_worked():
    checks = constraint_checks(with_copy_floor(results()))
    # mcts vs copy: A 1 vs 0 (win), B 1 vs 2/3 (win): P(X >= 2 | n 2) = 1/4
    r = sign_test(checks, "mcts", "copy", n_boot=100)
    assert (r["wins"], r["losses"], r["ties"], r["p"], r["win_share"]) == (2, 0, 0, 0.25, 1.0)
    # agent vs copy: A failed 0 vs 0 (tie), B "A." 2/3 vs 2/3 (tie): nothing to test
    r = sign_test(checks, "agent", "copy", n_boot=100)
    assert (r["wins"], r["losses"], r["ties"]) == (0, 0, 2) and math.isnan(r["p"])
    assert math.isnan(sign_test(checks, "mcts", "iter")["p"])  # a system that did not run


def test_bench_reads_calls_per_solved_from_a_run(tmp_path):
    from bench.craft import search_model_calls_per_solved

    assert search_model_calls_per_solved(tmp_path) is None
    (tmp_path / "runs").mkdir()
    results().to_parquet(tmp_path / "runs" / "part-0.parquet")
    assert search_model_calls_per_solved(tmp_path) == (5.5, 2, 2, 11)


def test_copy_floor_per_constraint_and_per_call_on_all_of_cord():
    # issue 41: the paper-002 page gave the per-call figure (0.39 / 0.47 / 0.49 / 0.50) as the copy floor; the
    # job's metric is per constraint (a word-count range is one constraint of two calls): 0.39 / 0.46 / 0.46 / 0.4625
    from eval.craft.tools import constraint_accuracy
    from jobs.craft.revise import DataConfig, load_rows

    rows = load_rows(DataConfig(levels=[1, 2, 3, 4]))
    copy = rows.assign(system="copy", revision=rows["text"], error="")
    level = accuracy_by_level(constraint_checks(copy), n_boot=10).set_index("level")["accuracy"]
    assert [round(level[f"C{lv}"], 4) for lv in (1, 2, 3, 4)] == [0.39, 0.46, 0.46, 0.4625]
    per_call = [sum(constraint_accuracy(list(r.gold_calls), r.text, r.text)[0] for r in copy[copy["level"] == lv]
                    .itertuples()) / 100 for lv in (1, 2, 3, 4)]
    assert [round(v, 2) for v in per_call] == [0.39, 0.47, 0.49, 0.50]


def test_quality_table_reads_the_recorded_r_g_and_the_copy_row_gets_the_inputs_own():
    frame = pd.DataFrame({"id": ["a", "b"], "level": 1, "system": "mcts", "text": ["x y", "z w"],
                          "revision": ["x", "z"], "error": "", "constraints_json": "[]",
                          "quality": [60.0, 40.0], "quality_json": ['{"ppl": 10.0, "bart": -1.0}'] * 2,
                          "copy_quality": [50.0, 50.0], "copy_quality_json": ['{"ppl": 8.0, "bart": -0.5}'] * 2})
    table = quality_table(with_copy_floor(frame), n_boot=10).set_index("system")
    assert table.loc["mcts", "quality"] == pytest.approx(50.0) and table.loc["copy", "quality"] == 50.0
    assert table.loc["copy", "ppl"] == 8.0 and table.loc["mcts", "bart"] == -1.0


def test_children_share_sums_the_searches_children_that_beat_the_copy():
    from eval.craft.results import children_share

    detail = [json.dumps({"children_vs_copy": {"children": 4, "usable": 3, "better": 1, "copy_met": 1}}),
              json.dumps({"children_vs_copy": {"children": 4, "usable": 2, "better": 0, "copy_met": 2}}), "{}"]
    frame = pd.DataFrame({"system": ["mcts", "mcts", "direct"], "detail_json": detail})
    (row,) = children_share(frame).to_dict("records")
    assert (row["system"], row["usable"], row["better_than_copy"], row["instances_with_one"]) == ("mcts", 5, 1, 1)
    assert row["share"] == pytest.approx(0.2)
