"""The judge_eval job end to end on real Ray (a tiny random model + a scripted hosted judge), and its input errors.

The hosted judge (faked at the HTTP edge) answers in MENLO's format with the *gold* grades of the fixture, except:
ja_JP answers carry no grades (parse failures), and in fr_FR pairwise calls it always gives the first-shown
response 5 and the other 1 (a position bias). Every expected number below follows from the first 8 test pairs of
configs/data/menlo_fixture.jsonl:

    pair  dim / locale   gold      pair  dim / locale   gold
    01    flu  de_DE     5 2       05    flu  fr_FR     5 2
    02    tone ja_JP     5 1       06    tone hi_IN     5 3
    03    lt   fr_FR     5 1       07    lt   es_MX     5 3
    04    lf   hi_IN     5 1       08    lf   de_DE     5 2

The tiny random model never writes the format: all of its calls are kept as parse failures.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from eval.judging.menlo_data import read_menlo_jsonl
from eval.judging.menlo_parse import MENLO_LABELS
from jobs.cli import main as cli_main
from tests.fake_openai_server import FakeOpenAIServer
from tests.wandb_reader import read_run

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "configs" / "data" / "menlo_fixture.jsonl"
BLOCK = re.compile(r"\[Locale\]\n(?P<locale>\S+)\n\n\[User Prompt\]\n(?P<prompt>.*?)\n\n\[Response(?: A)?\]\n"
                   r"(?P<first>.*?)(?:\n\n\[Response B\]\n(?P<second>.*))?$", re.DOTALL)


def gold_lookup() -> dict[tuple[str, str], int]:
    pairs = read_menlo_jsonl(FIXTURE)
    return {(r.prompt, getattr(r, f"response_{s}")): int(getattr(r, f"gold_{s}"))
            for r in pairs.itertuples() for s in ("a", "b")}


GOLD = gold_lookup()


def grade(tag: str, k: int) -> str:
    return f"<{tag}> FINAL GRADE: {k} - {MENLO_LABELS[k]} </{tag}>"


def scripted_judge(user: str) -> str | None:
    match = BLOCK.match(user)
    if not match:
        return None
    if match["locale"] == "ja_JP":
        return "Both answers read well to me."
    first = GOLD[(match["prompt"], match["first"])]
    if match["second"] is None:
        return f"<think>Judged against the rubric.</think>\n{grade('final_grade', first)}"
    second = GOLD[(match["prompt"], match["second"])]
    if match["locale"] == "fr_FR":
        first, second = 5, 1
    return f"<think>Compared both.</think>\n{grade('final_grade_A', first)}\n{grade('final_grade_B', second)}"


def tiny_config(tmp_path: Path, model_dir: str, server_url: str = "http://127.0.0.1:9/v1", **data) -> Path:
    config = {
        "job": "judge_eval", "ray": {"num_cpus": 2}, "wandb": {"project": "quorum-test"},
        "data": {"path": str(FIXTURE), "limit": 8, **data},
        "protocols": [{"name": "point+rubric", "mode": "pointwise"},
                      {"name": "fewshot", "mode": "pointwise", "rubric": False, "fewshot": True},
                      {"name": "pair+rubric", "mode": "pairwise"}],
        "judges": [
            {"name": "tiny", "engine": {"kind": "hf", "model": model_dir, "num_threads": 1, "max_batch_size": 16},
             "sampling": {"max_tokens": 8}, "pool": {"num_cpus": 0.5, "batch_size": 16}},
            {"name": "api", "engine": {"kind": "openai", "model": "menlo-judge", "base_url": server_url,
                                       "max_concurrency": 4},
             "pool": {"num_cpus": 0.25, "batch_size": 16}, "max_parse_retries": 1}],
        "report": {"n_boot": 100},
    }
    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def value(metrics: pd.DataFrame, judge: str, protocol: str, statistic: str, slice_: str = "all") -> pd.Series:
    row = metrics[(metrics["judge"] == judge) & (metrics["protocol"] == protocol) & (metrics["slice"] == slice_)
                  & (metrics["statistic"] == statistic)]
    assert len(row) == 1, (judge, protocol, statistic, slice_)
    return row.iloc[0]


@pytest.mark.slow
def test_judge_eval_end_to_end(ray_local, tiny_model_dir, tmp_path):
    root = tmp_path / "runs"
    with FakeOpenAIServer(reply=scripted_judge) as server:
        cfg = tiny_config(tmp_path, tiny_model_dir, server.base_url)
        assert cli_main(["run", str(cfg), f"run.root={root}", "wandb.mode=offline", "run.id=t"]) == 0
        # the ja_JP calls were retried once (max_parse_retries: 1): 2 + 2 + 2 first calls, then again
        assert len(server.calls_matching("ja_JP")) == 12
    run = root / "judge_eval" / "t"
    manifest = json.loads((run / "manifest.json").read_text())
    stages = ["data", "items", "judgments", "metrics", "differences"]
    assert [manifest["stages"][s]["status"] for s in stages] == ["complete"] * 5

    judgments = pd.read_parquet(run / "judgments")
    # 8 pairs x (2 pointwise + 2 few-shot + 2 orders) = 48 calls per judge; nothing dropped
    assert judgments.groupby("judge").size().to_dict() == {"api": 48, "tiny": 48}
    tiny, api = judgments[judgments["judge"] == "tiny"], judgments[judgments["judge"] == "api"]
    assert (tiny["parse_error"] != "").all() and tiny["pred_a"].isna().all()
    assert set(api.loc[api["parse_error"] != "", "locale"]) == {"ja_JP"} and (api["parse_error"] != "").sum() == 6
    assert manifest["stages"]["judgments"]["summary"]["parse_failures"] == 48 + 6

    metrics = pd.read_parquet(run / "metrics")
    # pointwise: 14 of 16 responses graded right (the ja_JP pair's two are failures, scored wrong), 7 of 8 prefs
    for protocol in ("point+rubric", "fewshot"):
        assert value(metrics, "api", protocol, "accuracy")["value"] == pytest.approx(14 / 16)
        assert value(metrics, "api", protocol, "preference_accuracy")["value"] == pytest.approx(7 / 8)
        assert value(metrics, "api", protocol, "parse_failure_rate")["value"] == pytest.approx(2 / 16)
    # pairwise: 32 responses; 5 exact pairs x 4 = 20 right; pair 05: AB (5,1) one right, BA (1,5) none; pair 03:
    # AB (5,1) two right, BA (1,5) none -> 23/32. Preferences: 10 exact + the two fr_FR AB orders = 12/16.
    # Swaps: the two fr_FR pairs flip, the five others do not, ja_JP has no grades -> 2/7.
    assert value(metrics, "api", "pair+rubric", "accuracy")["value"] == pytest.approx(23 / 32)
    assert value(metrics, "api", "pair+rubric", "preference_accuracy")["value"] == pytest.approx(12 / 16)
    bias = value(metrics, "api", "pair+rubric", "position_bias_rate")
    assert (bias["value"], bias["n_used"], bias["n_excluded"]) == (pytest.approx(2 / 7), 7, 1)
    assert value(metrics, "api", "pair+rubric", "position_bias_rate", "locale=fr_FR")["value"] == 1.0
    assert value(metrics, "api", "point+rubric", "accuracy", "dimension=tone")["value"] == 0.5  # ja_JP's pair
    assert value(metrics, "tiny", "pair+rubric", "accuracy")["value"] == 0.0
    head = value(metrics, "api", "point+rubric", "macro_f1")
    assert head["ci_lo"] <= head["value"] <= head["ci_hi"]

    diffs = pd.read_parquet(run / "differences").set_index(["judge", "protocol", "statistic"])
    # every group minus the config's first (tiny / point+rubric: every call unparsed, all scored wrong)
    assert len(diffs) == 5 * 3 and set(diffs["versus"]) == {"tiny / point+rubric"}
    row = diffs.loc[("api", "point+rubric", "accuracy")]
    assert row["difference"] == pytest.approx(14 / 16) and row["n_pairs"] == 8
    assert row["ci_lo"] <= row["difference"] <= row["ci_hi"]

    markdown = (run / "metrics.md").read_text()
    assert "## Paired differences vs tiny / point+rubric" in markdown
    headline_rows = re.findall(r"^\|\s*(tiny|api)\s*\|\s*(\S+)\s*\|", markdown.split("## Paired differences")[0],
                               re.MULTILINE)
    assert headline_rows == [(j, p) for j in ("tiny", "api") for p in ("point+rubric", "fewshot", "pair+rubric")]
    assert re.search(r"\|\s*api\s*\|\s*pair\+rubric\s*\|.*\|\s*0\.286 \[", markdown)  # position bias cell
    assert re.search(r"\|\s*tiny\s*\|\s*fewshot\s*\|\s*16\s*\|\s*16\s*\|", markdown)  # parse health: calls, failures
    page = (run / "report.html").read_text()
    images = page.split('src="data:image/png;base64,')[1:]
    assert len(images) == 2 and all(base64.b64decode(i.split('"', 1)[0]).startswith(b"\x89PNG") for i in images)
    (wandb_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    logged = read_run(wandb_file)
    types = {k.removesuffix("/_type"): v for step in logged["history"] for k, v in step.items()
             if k.endswith("/_type")}
    assert types["report/headline"] == types["report/metrics"] == "table-file"
    assert logged["summary"]["metrics/api/pair+rubric/position_bias_rate"] == pytest.approx(2 / 7)

    before = {s: manifest["stages"][s]["finished_at"] for s in stages}
    assert cli_main(["run", str(cfg), f"run.root={root}", "wandb.mode=disabled", "run.id=t"]) == 0
    again = json.loads((run / "manifest.json").read_text())
    assert {s: again["stages"][s]["finished_at"] for s in stages} == before  # every stage resumed


# ---------------------------------------------------------------------------------------------------------------
# Input errors: exit code 2 before any model is loaded, naming the key (and file / line)


def test_malformed_data_line_exits_2_naming_file_line_and_field(tmp_path, capsys):
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[2])
    record["gold_b"] = 7
    bad = tmp_path / "menlo.jsonl"
    bad.write_text("\n".join(lines[:2] + [json.dumps(record)] + lines[3:]) + "\n", encoding="utf-8")
    cfg = tiny_config(tmp_path, "smollm2-135m")  # never loaded: the run stops at the config check
    assert cli_main(["run", str(cfg), f"data.path={bad}", f"run.root={tmp_path / 'runs'}", "wandb.mode=disabled"]) == 2
    err = capsys.readouterr().err
    assert "data.path:" in err and "menlo.jsonl: line 3, field 'gold_b': grade must be a number in [1, 5]" in err


def test_missing_exemplar_exits_2_naming_the_key(tmp_path, capsys):
    # the fixture has no val pairs: the few-shot protocol finds no exemplar at all
    cfg = tiny_config(tmp_path, "smollm2-135m")  # never loaded: the run stops at the config check
    args = ["run", str(cfg), "data.exemplar_splits=[val]", f"run.root={tmp_path / 'runs'}", "wandb.mode=disabled"]
    assert cli_main(args) == 2
    assert "data.exemplar_splits: fewshot: no exemplar graded 1-2 for dimension" in capsys.readouterr().err


@pytest.mark.parametrize("override, named", [
    ("protocols.0.mode=listwise", "protocols.0.mode"),
    ("protocols.1.template=menlo_pointwise", "protocols.1.template: 'menlo_pointwise' has no 'examples'"),
    ("protocols.1.name=point+rubric", "protocols: need at least one, with unique names"),
    ("data.eval_splits=[dev]", "data.eval_splits"),
    ("data.dimensions=[style]", "data.dimensions"),
    ("data.path=/no/such/menlo.jsonl", "data.path: file not found"),
    ("report.failures=drop", "report.failures"),
    ("judges.0.pool.num_cpus=2", "judges: the judge pools ask for 2.25 CPUs together"),
    ("judges.1.engine.modle=x", "judges.1.engine.modle"),
])
def test_config_errors_exit_2_naming_the_key(tmp_path, capsys, override, named):
    cfg = tiny_config(tmp_path, "smollm2-135m")  # never loaded: the run stops at the config check
    assert cli_main(["run", str(cfg), override, f"run.root={tmp_path / 'runs'}", "wandb.mode=disabled"]) == 2
    assert named in capsys.readouterr().err
