"""Every value a job can check is checked before any work: the run stops with exit 2, the message names the
dotted key (or the file and line), and no run directory (no manifest saying `running`) is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "demo.yaml")


def run_cli(config: str, tmp_path: Path, *overrides: str) -> int:
    return cli_main(["run", config, f"run.root={tmp_path / 'runs'}", *overrides])


def assert_no_run_started(tmp_path: Path) -> None:
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("manifest*"))


@pytest.mark.parametrize("override, named", [
    # the shared sampling / engine / pool checks, wherever a job nests those sections
    ("generate.0.sampling.temperature=-1", "generate.0.sampling.temperature"),
    ("generate.0.sampling.temperature=.nan", "generate.0.sampling.temperature"),
    ("generate.0.sampling.top_p=1.5", "generate.0.sampling.top_p"),
    ("generate.0.sampling.max_tokens=0", "generate.0.sampling.max_tokens"),
    ("generate.0.sampling.seed=1180591620717411303424", "generate.0.sampling.seed"),
    ("jury.judges.0.sampling.top_k=0", "jury.judges.0.sampling.top_k"),
    ("generate.0.engine.kind=tpu", "generate.0.engine.kind"),
    ("generate.0.engine.dtype=float8", "generate.0.engine.dtype"),
    ("generate.0.engine.max_batch_size=0", "generate.0.engine.max_batch_size"),
    ("generate.0.engine.model=/no/such/model", "generate.0.engine.model"),
    ("evaluate.engine.adapter=/no/such/adapter", "evaluate.engine.adapter"),
    ("features.align.model_dir=/no/such/encoder", "features.align.model_dir"),
    ("selector.checkpoint=/no/such/lens", "selector.checkpoint"),
    # prompt template names
    ("jury.judges.0.template=no_such_template", "jury.judges.0.template"),
    ("policies.lexical=no_such_template", "policies.lexical"),
    ("pairs.prompts.lexical=no_such_template", "pairs.prompts.lexical"),
    # ranges
    ("pairs.dev_fraction=1.5", "pairs.dev_fraction"),
    ("evaluate.n_boot=0", "evaluate.n_boot"),
    ("data.offset=-1", "data.offset"),
    ("data.limit=-1", "data.limit"),
    ("data.min_words=-1", "data.min_words"),
    ("ray.num_cpus=-1", "ray.num_cpus"),
    # a secret in a runtime env would be written to Ray's logs
    ("ray.env_vars={WANDB_API_KEY: k}", "ray.env_vars.WANDB_API_KEY"),
    ("train.trainer.env_vars={JUDGE_API_TOKEN: t}", "train.trainer.env_vars.JUDGE_API_TOKEN"),
    # evaluation data: checked now, not after training; a set path that is missing is never replaced by the demo
    ("evaluate.split=no_such_split", "evaluate.split"),
    ("evaluate.path=/nonexistent", "evaluate.path"),
])
def test_bad_values_stop_the_run_before_any_work(override, named, tmp_path, capsys):
    assert run_cli(DEMO, tmp_path, override) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert_no_run_started(tmp_path)


@pytest.mark.parametrize("config, override, named", [
    ("jury_eval_demo.yaml", "jury.judges.0.sampling.temperature=-1", "jury.judges.0.sampling.temperature"),
    ("jury_eval_demo.yaml", "synth.writer.engine.dtype=x", "synth.writer.engine.dtype"),
    ("judge_eval_demo.yaml", "judges.0.engine.max_batch_size=0", "judges.0.engine.max_batch_size"),
    ("judge_eval_demo.yaml", "judges.0.sampling.top_p=2", "judges.0.sampling.top_p"),
    ("judge_grpo_demo.yaml", "grpo.lr=-1", "grpo.lr"),
    # a section checks itself under the key the job nests it at (core.config.Section), never a guessed prefix
    ("demo.yaml", "train.trainer.lora.r=0", "train.trainer.lora.r"),
    ("demo.yaml", "train.trainer.deepspeed.zero_stage=4", "train.trainer.deepspeed.zero_stage"),
    ("demo.yaml", "jury.judges.0.pool.batch_size=0", "jury.judges.0.pool.batch_size"),
    ("judge_grpo_demo.yaml", "grpo.rollout.top_p=0", "grpo.rollout.top_p"),
    ("judge_grpo_demo.yaml", "grpo.group_size=1", "grpo.group_size"),
    ("judge_grpo_demo.yaml", "reward.format_rule=loose", "reward.format_rule"),
    ("judge_sft_demo.yaml", "train.warmup_ratio=1", "train.warmup_ratio"),
    ("policy_grpo_demo.yaml", "reward.signal=vibes", "reward.signal"),
    ("jury_eval_demo.yaml", "wandb.mode=loud", "wandb.mode"),
])
def test_every_job_shares_the_section_checks(config, override, named, tmp_path, capsys):
    assert run_cli(str(REPO / "configs" / config), tmp_path, override) == 2
    assert named in capsys.readouterr().err
    assert_no_run_started(tmp_path)


def test_serve_config_checks_sampling(capsys):
    assert cli_main(["serve", str(REPO / "configs" / "grm.yaml"), "sampling.temperature=-1", "--print-config"]) == 2
    assert "sampling.temperature" in capsys.readouterr().err


def test_source_filter_leaving_no_rows_is_a_clear_error(tmp_path, capsys):
    assert run_cli(DEMO, tmp_path, "data.min_words=1000") == 2
    assert "0 rows left after data.min_words=1000" in capsys.readouterr().err
    assert_no_run_started(tmp_path)


def test_lone_surrogate_in_a_jsonl_text_names_the_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "A fine sentence here."}\n{"text": "Broken \\ud800 text."}\n', encoding="utf-8")
    assert run_cli(DEMO, tmp_path, f"data.path={corpus}") == 2
    err = capsys.readouterr().err
    assert f"{corpus}: line 2" in err and "surrogate" in err
    assert_no_run_started(tmp_path)


def test_non_utf8_config_and_job_list_are_clean_errors(tmp_path, capsys):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("job: policy_simplify\n# caf\xe9\n".encode("latin-1"))
    assert cli_main(["run", str(latin)]) == 2
    assert f"{latin}: line 2: not valid UTF-8" in capsys.readouterr().err
    listed = tmp_path / "listed.yaml"
    listed.write_text("job: [policy_simplify]\n", encoding="utf-8")
    assert cli_main(["run", str(listed)]) == 2
    assert "key 'job' must be one of" in capsys.readouterr().err


@pytest.mark.parametrize("run_id", ["../../x", "a/b", ".."])
def test_run_id_is_one_directory_name(run_id, capsys):
    """`run.id=../../x` used to write the run outside <run.root>/<job>/."""
    assert cli_main(["run", str(REPO / "configs" / "demo.yaml"), f"run.id={run_id}"]) == 2
    assert "run.id" in capsys.readouterr().err


def test_config_sections_share_one_validation_style():
    """The one validation style (docs/configuration.md): a section's own rules live in `check(where)` on a `core.config.Section`, so
    `check_tree` reaches them under their dotted key; `validate()` is left to the job configs (rules across sections)
    and ServeConfig, which `load_config` calls once everything below has checked itself."""
    import dataclasses
    import importlib
    import pkgutil

    from core.config import Section
    from core.jobrun import JobSections

    offenders = []
    for package in ("core", "eval", "actors", "train", "serve", "jobs"):
        for info in pkgutil.walk_packages([str(REPO / package)], prefix=f"{package}."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__):
                    continue
                own = vars(obj)
                if "check" in own and not issubclass(obj, Section):
                    offenders.append(f"{obj.__module__}.{obj.__name__}.check outside core.config.Section")
                top_level = issubclass(obj, JobSections) or obj.__name__ == "ServeConfig"
                if "validate" in own and not top_level:
                    offenders.append(f"{obj.__module__}.{obj.__name__}.validate on a section (use check(where))")
    assert offenders == []


def test_lens_without_a_local_checkpoint_stops_the_run(tmp_path, capsys, monkeypatch):
    """Paper 000 Fig. 2's LENS column needs a local checkpoint and `lens-metric`; asked for without them, the run
    stops at config time naming evaluate.lens and what to set (never a results table silently without LENS)."""
    monkeypatch.delenv("QUORUM_LENS_PATH", raising=False)
    assert run_cli(DEMO, tmp_path, "evaluate.lens=true") == 2
    err = capsys.readouterr().err
    assert "evaluate.lens" in err and "QUORUM_LENS_PATH" in err
    assert run_cli(DEMO, tmp_path, "evaluate.lens=true", f"evaluate.lens_checkpoint={tmp_path / 'no.ckpt'}") == 2
    assert "evaluate.lens" in capsys.readouterr().err
    assert_no_run_started(tmp_path)


def test_jury_eval_lens_metrics_need_their_checkpoint(tmp_path, capsys, monkeypatch):
    """Paper 001 Fig. 2's LENS / LENS-SALSA columns: asked for without a local checkpoint, exit 2 before any work."""
    for env in ("QUORUM_LENS_PATH", "QUORUM_LENS_SALSA_PATH"):
        monkeypatch.delenv(env, raising=False)
    config = str(REPO / "configs" / "jury_eval_demo.yaml")
    assert run_cli(config, tmp_path, "report.metrics=[fkgl, lens_salsa]") == 2
    err = capsys.readouterr().err
    assert "report.metrics: lens_salsa" in err and "QUORUM_LENS_SALSA_PATH" in err
    assert_no_run_started(tmp_path)
