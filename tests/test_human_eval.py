"""Human-evaluation round trip (papers 000 Table 4, 001 Fig. 1) and the size curve (000 Fig. 3): the result CLIs."""

from __future__ import annotations

import pandas as pd
import pytest

from eval.judging import human_eval as he
from jobs.cli import main as cli_main


def outputs(n_sources: int = 4) -> pd.DataFrame:
    rows = []
    for i in range(n_sources):
        for system, size in (("small", 1.0), ("big", 8.0)):
            rows.append({"id": f"s{i}", "source": f"Source {i}.", "system": system, "output": f"{system} {i}",
                         "size_b": size, "jury": size / 2 + i})
    return pd.DataFrame(rows)


def test_sheet_is_blind_and_sampled_by_seed():
    sheet, key = he.make_sheet(outputs(), n_sources=3, seed=1, keep=("size_b",))
    assert list(sheet.columns) == he.SHEET_COLUMNS and (sheet["rating"] == "").all()
    assert len(sheet) == 6 and key["id"].nunique() == 3  # 3 sources x 2 systems
    assert not {"system", "size_b", "id"} & set(sheet.columns)  # nothing identifies the system
    assert all("small" not in i and "big" not in i for i in sheet["item_id"])
    assert sheet["item_id"].is_unique and list(sheet["item_id"]) == list(key["item_id"])
    again, _ = he.make_sheet(outputs(), n_sources=3, seed=1, keep=("size_b",))
    assert again.equals(sheet)
    with pytest.raises(ValueError, match="asked for 5 sources, only 4"):
        he.make_sheet(outputs(), n_sources=5)


def test_ratings_statistics_by_hand(tmp_path):
    sheet, key = he.make_sheet(outputs(3), n_sources=0, seed=0, keep=("size_b", "jury"))
    by_item = dict(zip(key["item_id"], zip(key["system"], key["id"])))
    # annotator a: big 4, small 2 everywhere; annotator b: big 5, small 3 (b = a + 1: perfect consistency, but not
    # absolute agreement, so ICC(2,1) < 1)
    for name, shift in (("a", 0), ("b", 1)):
        filled = sheet.assign(rating=[(4 if by_item[i][0] == "big" else 2) + shift for i in sheet["item_id"]])
        filled.to_csv(tmp_path / f"{name}.csv", index=False)
    ratings = pd.concat([he.read_ratings(tmp_path / f"{n}.csv", key) for n in "ab"], ignore_index=True)
    items = he.per_item(key, ratings)
    means = he.system_means(items, n_boot=50).set_index("system")
    assert means.loc["big", "mean"] == 4.5 and means.loc["small", "mean"] == 2.5
    assert means.loc["big", "normalised"] == pytest.approx(0.875)  # (4.5 - 1) / 4
    stats = he.statistics(items, ("size_b",), n_boot=50).set_index("statistic")
    # ICC(2,1) by hand, 6 items x 2 raters: row means 4.5 / 2.5 (3 items each), grand mean 3.5, so
    # MSR = 2 * 6 * 1^2 / 5 = 2.4; column means 3 and 4: MSC = 6 * (0.25 + 0.25) / 1 = 3; every residual
    # x - row - column + grand is 0: MSE = 0; ICC = (MSR - MSE) / (MSR + MSE + 2 * (MSC - MSE) / 6) = 2.4 / 3.4
    assert stats.loc["ICC(2,1) among 2 annotators", "value"] == pytest.approx(2.4 / 3.4)
    assert stats.loc["Spearman(human, size_b)", "value"] == pytest.approx(1.0)


@pytest.mark.parametrize("edit, message", [
    (lambda df: df.assign(rating=["6"] + list(df["rating"][1:])), "line 2, column 'rating': '6' is not an integer"),
    (lambda df: df.assign(rating=["4.5"] + list(df["rating"][1:])), "line 2, column 'rating': '4.5'"),
    (lambda df: pd.concat([df, df.iloc[:1]]), "already rated on line 2"),
    (lambda df: df.iloc[1:], "1 items of the key are not rated"),
    (lambda df: df.drop(columns="rating"), "no 'rating' column"),
])
def test_bad_ratings_name_file_line_and_column(tmp_path, edit, message):
    sheet, key = he.make_sheet(outputs(2), n_sources=0)
    edit(sheet.assign(rating="3")).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(he.RatingsError, match=message):
        he.read_ratings(tmp_path / "r.csv", key)


def test_cli_round_trip_on_a_jury_eval_run(tmp_path, capsys):
    run = tmp_path / "run"
    scores = outputs(5).rename(columns={"system": "model", "output": "candidate"}).assign(
        set="synthetic", generation_error="")
    (run / "scores").mkdir(parents=True)
    scores.to_parquet(run / "scores" / "part-0.parquet")
    out = tmp_path / "human"
    assert cli_main(["human", "export", str(run), "--out", str(out), "--n", "4"]) == 0
    sheet = pd.read_csv(out / "sheet.csv", dtype=str, keep_default_na=False)
    key = pd.read_csv(out / "key.csv")
    assert len(sheet) == 8 and {"size_b", "jury"} <= set(key.columns)
    sizes = dict(zip(key["item_id"], key["size_b"]))
    for name in ("r1", "r2", "r3"):
        sheet.assign(rating=["5" if sizes[i] == 8.0 else "2" for i in sheet["item_id"]]).to_csv(
            out / f"{name}.csv", index=False)
    assert cli_main(["human", "import", str(out), *(str(out / f"{n}.csv") for n in ("r1", "r2", "r3")),
                     "--n-boot", "20"]) == 0
    report = (out / "human_eval.md").read_text()
    assert "ICC(2,1) among 3 annotators" in report and "Spearman(human, size_b)" in report
    bad = sheet.assign(rating="x")
    bad.to_csv(out / "r4.csv", index=False)
    assert cli_main(["human", "import", str(out), str(out / "r4.csv")]) == 2
    assert "r4.csv: line 2, column 'rating'" in capsys.readouterr().err
    assert cli_main(["human", "export", str(tmp_path / "nope"), "--out", str(out)]) == 2


def test_size_curve_reads_finished_runs_and_refuses_unfinished_ones(tmp_path, capsys):
    import json

    def fake_run(name: str, rows: int, sari: float, complete: bool = True) -> str:
        run = tmp_path / name
        (run / "results").mkdir(parents=True)
        pd.DataFrame([
            {"system": "vanilla", "sari": 35.0, "sari_lo": 34.0, "sari_hi": 36.0, "sari_gain": 0.0,
             "sari_gain_lo": 0.0, "sari_gain_hi": 0.0},
            {"system": "trained", "sari": sari, "sari_lo": sari - 1, "sari_hi": sari + 1, "sari_gain": sari - 35.0,
             "sari_gain_lo": sari - 36.0, "sari_gain_hi": sari - 34.0}]).to_parquet(run / "results" / "part-0.parquet")
        stages = {"train": {"status": "complete", "summary": {"train_pairs": rows}},
                  "results": {"status": "complete" if complete else "running"}}
        (run / "manifest.json").write_text(json.dumps({"stages": stages}))
        return str(run)

    runs = [fake_run("size2k", 2000, 37.5), fake_run("size1k", 1000, 36.0)]
    out = tmp_path / "fig3"
    assert cli_main(["curve", *runs, "--out", str(out)]) == 0
    table = (out / "curve.md").read_text()
    assert table.index("1000") < table.index("2000") and "37.50" in table  # sorted by size
    assert (out / "curve.png").read_bytes().startswith(b"\x89PNG")
    assert cli_main(["curve", fake_run("size4k", 4000, 38.0, complete=False), "--out", str(out)]) == 2
    assert "size4k: stage 'results' is not complete" in capsys.readouterr().err
