"""AgentSimp (paper 004) scored and run as its authors do: D-SARI as the reference script computes it on raw text,
heading lines that are not sentences, BERTScore over whole documents, "None" findings that change nothing, and cut
or collapsed stage outputs that fall back to the stage's input, counted.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from eval.agentsimp.metrics import score_document
from eval.agentsimp.outputs import Reply, settle
from eval.agentsimp.parse import RoleValue, parse_output
from eval.agentsimp.plan import PlanConfig, configurations, plan_document
from eval.agentsimp.records import run_rows
from eval.agentsimp.run import run_schedule
from eval.metrics.dsari import compute_length_penalties, document_sari
from eval.metrics.sari import score_xu2016
from eval.metrics.textnorm import count_syllables, normalize
from tests.agentsimp_fake import FakeTeam, answer

# a raw two-paragraph document, its simplification and one reference (ours)
SOURCE = ("The city council voted on Tuesday to raise bus fares by 20 percent, citing rising fuel costs and a "
          "shortfall in the transit budget. Officials said the increase would take effect in March.\n\n"
          "Residents who rely on buses criticized the decision. Many said they could not afford the higher fares "
          "and asked the council to find other sources of revenue.")
OUTPUT = ("The city council decided on Tuesday to make bus fares 20 percent higher. Fuel costs more, and the "
          "transit budget is short. The new fares start in March.\n\n"
          "People who take the bus were unhappy. Many said they cannot pay more and asked the council to find "
          "money in other ways.")
REFERENCE = ("On Tuesday, the city council voted to raise bus fares by 20 percent. Fuel costs are rising. The transit "
             "budget is short of money. The higher fares start in March.\n\n"
             "Many people who ride buses did not like the decision. They said they could not pay the higher fares. "
             "They asked the council to find money in other ways.")


# ----------------------------------------------------------------------------- 4. D-SARI on raw text


def test_dsari_is_the_reference_scripts_on_raw_text():
    # RLSNLP/Document-level-text-simplification D_SARI.py, D_SARIsent(SOURCE, OUTPUT, [REFERENCE]) (its
    # nltk.sent_tokenize gives 5 and 7 sentences here, as any Punkt does) returns
    # (0.45059991586639847, keep 0.40208125413470935, del 0.7724540553785837, add 0.17726443808590225).
    score = document_sari(SOURCE, OUTPUT, [REFERENCE], return_components=True)
    assert tuple(score) == pytest.approx((45.059991586639847, 17.726443808590225, 40.208125413470935,
                                          77.24540553785837), abs=1e-9)
    # its tokens: lower().split(" "), punctuation attached, the paragraph break inside one token
    tokens = OUTPUT.lower().split(" ")
    assert "higher." in tokens and "march.\n\npeople" in tokens
    assert score_xu2016(SOURCE.lower().split(" "), tokens, [REFERENCE.lower().split(" ")]).keep == pytest.approx(
        score.keep / compute_length_penalties(len(SOURCE.split(" ")), len(tokens), len(REFERENCE.split(" ")), 5, 7)[2])
    # sacrebleu's 13a is a knob, and it moves the number
    assert document_sari(SOURCE, OUTPUT, [REFERENCE], tokenizer="13a") == pytest.approx(48.284140104397075)
    assert score_document(SOURCE, OUTPUT, [REFERENCE])["dsari"] == pytest.approx(45.059991586639847)
    with pytest.raises(ValueError, match="unknown D-SARI tokenizer 'moses'"):
        document_sari(SOURCE, OUTPUT, [REFERENCE], tokenizer="moses")


# ----------------------------------------------------------------------------- 5. headings are not sentences


def _five_sentences() -> tuple[str, str]:
    body = ["The council will close the road for necessary repairs on Monday morning.",
            "Buses will temporarily use Mill Lane instead of the usual route.",
            "The construction work should take approximately two weeks.",
            "Local businesses will remain open throughout the repairs.",
            "Residents with questions can telephone the council office."]
    return " ".join(body[:3]) + "\n\n" + " ".join(body[3:]), "\n\n".join(body)


def test_heading_lines_leave_the_sentence_penalty_at_one():
    plain, reference = _five_sentences()
    first, second = plain.split("\n\n")
    headed = f"# Road works\n\n## What happens\n\n{first}\n\n## Questions\n\n{second}"
    # Punkt (D_SARI.py's nltk.sent_tokenize) ends sentences at . ! ? only: three heading lines add none, so
    # the output has the reference's 5 sentences and SLP stays 1. Counting each blank-line block as a sentence
    # end gives 8 against 5: SLP = exp(-3/8) = 0.687.
    score = document_sari(plain, headed, [reference], return_components=True)
    toks = headed.lower().split(" ")
    base = score_xu2016(plain.lower().split(" "), toks, [reference.lower().split(" ")])
    _, lp2, slp = compute_length_penalties(len(plain.split(" ")), len(toks), len(reference.split(" ")), 5, 5)
    assert slp == 1
    assert score.keep == pytest.approx(base.keep * lp2 * 1.0)
    assert score.keep != pytest.approx(base.keep * lp2 * math.exp(-3 / 8))
    from eval.agentsimp.metrics import document_fkgl
    from eval.metrics.textnorm import count_punkt_sentences

    assert count_punkt_sentences(headed) == count_punkt_sentences(plain) == count_punkt_sentences(reference) == 5
    # FKGL counts the same 5 sentences in the same output (EASSE's words and syllables, "#" tokens included)
    tokens = normalize(headed).split()
    syllables = sum(count_syllables(t) for t in tokens)
    assert document_fkgl(headed) == pytest.approx(0.39 * len(tokens) / 5 + 11.8 * syllables / len(tokens) - 15.59)
    assert score_document(plain, headed, [reference])["fkgl"] == pytest.approx(document_fkgl(headed))


# ----------------------------------------------------------------------------- 6. whole documents in BERTScore


def test_bertscore_of_the_job_sees_a_change_after_word_500():
    from jobs.agentsimp.config import Config
    from jobs.agentsimp.simplify import bertscore_fn

    rng = random.Random(0)
    vocab = ["the", "city", "council", "voted", "to", "raise", "bus", "fares", "because", "fuel", "costs", "rose",
             "and", "budget", "was", "short", "residents", "said", "they", "could", "not", "pay"]
    words = [rng.choice(vocab) for _ in range(600)]
    changed = list(words)
    changed[550:560] = ["elephant", "galaxy", "violin", "quantum", "pineapple"] * 2
    reference, candidate = " ".join(words), " ".join(changed)
    stages = pd.DataFrame({"doc_id": ["d", "d"], "paragraph": [-1, -1], "window": [-1, -1],
                           "text": [candidate, reference]})
    f1 = bertscore_fn(Config(), stages, {"d": [reference]})
    assert f1(reference, reference) == pytest.approx(1.0, abs=1e-5)
    assert f1(candidate, reference) < 0.995   # the first ~400 words alone are identical (F1 = 1.0)
    cfg = Config()
    cfg.evaluation.bertscore_mode = "truncate"
    assert bertscore_fn(cfg, stages, {"d": [reference]})(candidate, reference) == pytest.approx(1.0, abs=1e-5)


def test_document_bertscore_equals_sentence_bertscore_on_short_texts():
    from eval.metrics.bertscore import document_bertscore, sentence_bertscore

    cands, refs = ["The cat sat on the mat.", "Stock prices fell."], [["A cat sat on a mat."], ["The cat sat."]]
    for whole, short in zip(document_bertscore(cands, refs), sentence_bertscore(cands, refs)):
        assert tuple(whole) == pytest.approx(tuple(short), abs=1e-6)


# ----------------------------------------------------------------------------- 7. "None" means no change


def test_a_none_finding_leaves_the_text_unchanged():
    ma = parse_output("metaphorical_analyst", json.dumps({"analyzed result": "None",
                                                          "simplified result": "The cat, a lion, sat."}))
    assert ma.error == "" and ma.value.text is None
    pf = parse_output("proofreader", json.dumps({"mistakes": "None", "corrected article": "A rewritten article."}))
    assert pf.error == "" and pf.value.text is None
    found = parse_output("proofreader", json.dumps({"mistakes": "typo", "corrected article": "Fixed."}))
    assert (found.value.text, found.value.note) == ("Fixed.", "typo")

    class Rewrites(FakeTeam):
        def reply(self, attempt):
            if attempt.call.role == "metaphorical_analyst":
                return Reply(json.dumps({"analyzed result": "None", "simplified result": "REWRITTEN"}))
            if attempt.call.role == "proofreader":
                return Reply(json.dumps({"mistakes": "None", "corrected article": "REWRITTEN"}))
            return super().reply(attempt)

    run = run_schedule(plan_document("# T\n\nP1\n\nP2", ["P1", "P2"], configurations()["pl_direct"]), Rewrites())
    assert run.stage("ma") == run.stage("cs") and run.stage("pf") == run.stage("aa")
    assert "REWRITTEN" not in run.final


# ----------------------------------------------------------------------------- 8. cut or collapsed outputs


ARTICLE = ("The road closes on Monday. Buses use Mill Lane. The work takes two weeks. Shops stay open. "
           "Call the council with questions.")


def test_an_answer_cut_at_the_token_limit_falls_back_at_once():
    cut = Reply("# Road works\n\nThe road closes on Monday. Buses", completion_tokens=320, finish_reason="length")
    outcome = settle("article_architect_direct", [cut], RoleValue(ARTICLE), max_retries=2)
    assert outcome is not None and outcome.value.text == ARTICLE
    assert (outcome.fell_back, outcome.guard, outcome.attempts) == (True, "truncated", 1)
    assert outcome.errors == ("truncated: finish_reason length after 320 tokens",)


def test_a_cut_proofread_that_still_parses_falls_back():
    # under the grammar a string is closed when its token share runs out: the cut article is valid JSON; the
    # grammar's state (the article field holds its whole share of tokens) says it was cut
    from eval.agentsimp.grammar import field_tokens, main_field_tokens

    budget = main_field_tokens("proofreader", 1024)
    assert budget == field_tokens("proofreader", 1024)[1] == 731
    cut = Reply(json.dumps({"mistakes": "typos", "corrected article": "The road closes on Monday. Buses use Mi"}),
                completion_tokens=budget + 12, budget=budget, main_tokens=budget)
    assert parse_output("proofreader", cut.text).error == ""
    outcome = settle("proofreader", [cut], RoleValue(ARTICLE), max_retries=2)
    assert (outcome.value.text, outcome.guard, outcome.attempts) == (ARTICLE, "truncated", 1)
    # re-tokenizing a decoded string may merge a few sampled tokens: within the slack it still counts as cut
    near = Reply(cut.text, completion_tokens=budget + 12, budget=budget, main_tokens=budget - 22)
    assert settle("proofreader", [near], RoleValue(ARTICLE), 2).guard == "truncated"
    whole = Reply(cut.text, completion_tokens=budget - 1, budget=budget, main_tokens=budget - 40)
    assert settle("proofreader", [whole], RoleValue(ARTICLE), 2, min_ratio=0.0).guard == ""


def test_a_complete_400_token_article_with_60_tokens_of_findings_is_not_cut():
    # issue 41, wrong result 3: the guard compared ALL completion tokens with the article field's share, so a
    # complete 400-token article plus 60 tokens of findings (460 >= the 443-token article share of a 640-token
    # proofread) was "truncated" and replaced by the architect's text
    from eval.agentsimp.grammar import field_tokens, main_field_tokens
    from eval.agentsimp.outputs import cut_by_grammar

    budget = main_field_tokens("proofreader", 640)
    assert field_tokens("proofreader", 640) == [147, 443] and budget == 443
    article = ARTICLE + " The work is done at night."
    complete = Reply(json.dumps({"mistakes": "x", "corrected article": article}), completion_tokens=400 + 60 + 12,
                     budget=budget, main_tokens=400)
    assert not cut_by_grammar(complete)
    outcome = settle("proofreader", [complete], RoleValue(ARTICLE), max_retries=2)
    assert (outcome.value.text, outcome.guard, outcome.fell_back) == (article, "", False)
    # the finish reason still decides on its own, and an uncounted answer (-1) is judged by it alone
    stopped = Reply(complete.text, completion_tokens=640, finish_reason="length", budget=budget, main_tokens=400)
    assert settle("proofreader", [stopped], RoleValue(ARTICLE), 2).guard == "truncated"
    uncounted = Reply(complete.text, completion_tokens=640, budget=budget)
    assert settle("proofreader", [uncounted], RoleValue(ARTICLE), 2).guard == ""


def test_the_worker_counts_the_main_field_with_the_models_tokenizer():
    # the count behind `Reply.main_tokens`: the article field only, re-tokenized with the engine model's tokenizer
    from transformers import AutoTokenizer

    from actors.agentsimp_worker import RoleCompleter
    from actors.engines.cached import CachedEngine
    from actors.models import resolve_model_dir
    from eval.agentsimp.roles import load_role_book

    engine = CachedEngine({"kind": "hf", "model": "smollm2-135m"})  # never loaded: only its spec is read
    completer = RoleCompleter(engine, load_role_book(), 640, 0.6, 0, constrained=True)
    article = " ".join([ARTICLE] * 12)
    raw = json.dumps({"mistakes": "Two typos were fixed in the second and third sentences.",
                      "corrected article": article})
    tok = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    expected = len(tok(article, add_special_tokens=False).input_ids)
    attempt = SimpleNamespace(call=SimpleNamespace(role="proofreader"))  # main_tokens reads only the role
    assert completer.main_tokens(attempt, raw) == expected
    assert expected < len(tok(raw, add_special_tokens=False).input_ids) - 10  # the findings are not counted


def test_a_proofread_collapsing_the_document_falls_back_and_is_counted():
    class Collapses(FakeTeam):
        def reply(self, attempt):
            if attempt.call.role == "proofreader":
                return Reply(json.dumps({"mistakes": "many", "corrected article": "This is the corrected article."}))
            if attempt.call.role == "article_architect_direct":
                return Reply(answer("article_architect_direct", dict(attempt.call.inputs)))
            return super().reply(attempt)

    paragraphs = ["The road closes on Monday. Buses use Mill Lane.", "The work takes two weeks. Shops stay open."]
    runs = {name: run_schedule(plan_document("\n\n".join(paragraphs), paragraphs, config), Collapses())
            for name, config in configurations().items()}
    for run in runs.values():
        assert run.final == run.stage("aa") != "This is the corrected article."
        (pf,) = [outcome for call, outcome in run.calls if call.role == "proofreader"]
        assert (pf.fell_back, pf.guard, pf.attempts) == (True, "collapsed", 1)
    rows = run_rows("d", runs)
    assert [(r["collapsed"], r["truncated"], r["fallbacks"]) for r in rows] == [(1, 0, 1)] * 4
    assert json.loads(rows[0]["record_json"])["calls"][-1]["guard"] == "collapsed"
    # the knob turns the collapse check off: the proofreader's sentence is then the final text
    off = run_schedule(plan_document("\n\n".join(paragraphs), paragraphs, PlanConfig(collapse_ratio=0.0)),
                       Collapses())
    assert off.final == "This is the corrected article."


# ----------------------------------------------------------------------------- the cluster config


def test_cluster_config_needs_a_real_corpus_and_uses_the_shared_run_root():
    import yaml

    from core.config import ConfigError, load_config
    from jobs.agentsimp.config import Config

    configs = Path(__file__).resolve().parents[1] / "configs"
    with pytest.raises(ConfigError, match=r"inputs.paths.0: no such file or directory: /mnt/shared/data/newsela"):
        load_config(Config, configs / "agentsimp_cluster.yaml")
    cfg = load_config(Config, configs / "agentsimp_cluster.yaml", [f"inputs.paths=[{configs}/data/agentsimp_demo]"])
    assert "agentsimp_demo" not in (configs / "agentsimp_cluster.yaml").read_text().split("\ninputs:")[1]
    # the shared run root every cluster config uses
    craft = yaml.safe_load((configs / "craft_cluster.yaml").read_text())["run"]["root"]
    assert cfg.run.root == craft and cfg.run.root.startswith("/mnt/shared/")


def test_document_sari_is_easse_corpus_sari_over_the_whole_document_with_delete_as_f1():
    # declared (issue 41): one segment per document, lowercased 13a tokens, DELETE as F1 (EASSE); the knob gives
    # Xu et al. 2016's DELETE precision on the same segment
    from eval.agentsimp.metrics import score_document
    from eval.metrics.sari import corpus_sari, sentence_sari

    f1 = score_document(SOURCE, OUTPUT, [REFERENCE])["sari"]
    assert f1 == pytest.approx(corpus_sari([SOURCE], [OUTPUT], [[REFERENCE]]))
    precision = score_document(SOURCE, OUTPUT, [REFERENCE], sari_deletion="precision")["sari"]
    assert precision == pytest.approx(sentence_sari(SOURCE, OUTPUT, [REFERENCE]))
    assert precision != pytest.approx(f1)  # the two DELETE scores differ on this pair
    # not the mean of per-paragraph SARI (the document is one segment)
    paragraphs = [p for p in SOURCE.split("\n\n") if p.strip()]
    outputs = [p for p in OUTPUT.split("\n\n") if p.strip()]
    refs = [p for p in REFERENCE.split("\n\n") if p.strip()]
    assert len(paragraphs) == len(outputs) == len(refs) == 2
    assert f1 != pytest.approx(corpus_sari(paragraphs, outputs, [refs]))
