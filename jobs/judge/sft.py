"""Judge SFT (paper 003 Table 5 "SFT"; Table 19 pointwise with `prompt.mode=pointwise prompt.template=menlo_pointwise`):
a MENLO judge learns to write the gold grades directly.

The paper's SFT baseline: "models directly predict 5-point grades for response pairs without generating intermediate
reasoning, trained with cross-entropy loss under teacher forcing" (TRL, lr 2e-5). The prompts are judge_grpo's (same
template, rubrics, both A/B orders with the gold grades swapped); the target is the verdict in MENLO's output format
with an empty think block, `<think> </think>` then the A and B grade blocks of the gold classes, which the judge's
parser reads as format_ok. Evaluate the result with `judge_eval` (`judges.N.engine.model=RUN/train/run/model` after
`train.finetune: full`, `judges.N.engine.adapter=RUN/train/run/adapter` after a LoRA).

Local (SmolLM2-135M, 2 Ray Train workers with DeepSpeed ZeRO-2 on CPU, LoRA):

    quorum run configs/judge_sft_demo.yaml
    python -m jobs.judge.sft configs/judge_sft_demo.yaml train.max_steps=2 run.id=short

On a cluster (the paper's full fine-tuning at lr 2e-5; Qwen3-4B on 8 A10Gs):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \\
        quorum run configs/judge_sft_cluster.yaml data.path=/mnt/shared/data/menlo/menlo_train.jsonl

Stages (under <run.root>/judge_sft/<run-id>/): rows (prompt + target per pair and shown order) -> train (SFT) ->
summary.md.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import pandas as pd

from core.config import ConfigError
from core.jobrun import JobSections, open_run, record_stages
from core.ray_env import init_ray
from core.runstore import RunStore, StageResult
from core.tracking import trainer_tracking
from eval.judging.menlo_data import gold_class
from eval.judging.menlo_parse import MENLO_LABELS
from jobs.entry import entry
from jobs.grpo_stages import file_sha, stage_rows
from jobs.judge.grpo import Config as GRPOJobConfig
from jobs.judge.grpo import DataConfig, PromptConfig, judge_rows
from train.config import TrainConfig

log = logging.getLogger("quorum.judge_sft")
JOB = "judge_sft"


def pointwise_target(grade: float) -> str:
    """The gold grade in MENLO's pointwise format, without reasoning (Table 19's pointwise SFT).

    >>> print(pointwise_target(2.5))
    <think> </think>
    <final_grade> FINAL GRADE: 3 - PASS </final_grade>
    """
    k = gold_class(grade)
    return f"<think> </think>\n<final_grade> FINAL GRADE: {k} - {MENLO_LABELS[k]} </final_grade>"


def verdict_target(grade_a: float, grade_b: float) -> str:
    """The gold verdict in MENLO's pairwise format, without reasoning (the paper's SFT target).

    >>> print(verdict_target(4.6, 2.0))
    <think> </think>
    <final_grade_A> FINAL GRADE: 5 - EXCELLENT </final_grade_A>
    <final_grade_B> FINAL GRADE: 2 - MINOR FAILURE </final_grade_B>
    """
    a, b = gold_class(grade_a), gold_class(grade_b)
    return (f"<think> </think>\n<final_grade_A> FINAL GRADE: {a} - {MENLO_LABELS[a]} </final_grade_A>\n"
            f"<final_grade_B> FINAL GRADE: {b} - {MENLO_LABELS[b]} </final_grade_B>")


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    # the preference trainer with loss sft (paper: TRL, lr 2e-5)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(loss="sft", lr=2e-5))

    def validate(self) -> None:
        # the data and prompt sections are judge_grpo's: the same checks
        GRPOJobConfig(data=self.data, prompt=self.prompt).validate_inputs()
        self.run.require_local()
        if self.train.loss != "sft":
            raise ConfigError(f"train.loss: judge SFT trains with 'sft', got {self.train.loss!r}")


def sft_rows(cfg: Config) -> pd.DataFrame:
    rows = judge_rows(GRPOJobConfig(data=cfg.data, prompt=cfg.prompt))
    if cfg.prompt.mode == "pointwise":  # one judged response per row, its gold in gold_a
        return rows.assign(target=[pointwise_target(a) for a in rows["gold_a"]])
    return rows.assign(target=[verdict_target(a, b) for a, b in zip(rows["gold_a"], rows["gold_b"])])


def stage_train(store: RunStore, cfg: Config) -> StageResult:
    trainer = dataclasses.replace(cfg.train, run_name="judge-sft", **trainer_tracking(cfg.wandb, JOB, store.run_id))

    def produce(out_dir: str) -> dict:
        from train.preference.trainer import train_stage

        rows = store.read_stage("rows").to_pandas()
        train, val = ([{"prompt_messages": p, "target": t} for p, t in zip(part["prompt_messages"], part["target"])]
                      for part in (rows[rows["role"] == "train"], rows[rows["role"] == "val"]))
        return train_stage(trainer, train, val, out_dir=out_dir, wandb_dir=store.path, where="train")

    return store.run_stage("train", {"train": dataclasses.asdict(cfg.train), "wandb": cfg.wandb.on}, produce)


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    sft_rows(cfg)  # bad data fails before the run directory (and its manifest) exists
    run = open_run(JOB, cfg, config_path)
    store, tracker = run.store, run.start_tracking(JOB, cfg.wandb)
    key = {"data": dataclasses.asdict(cfg.data), "prompt": dataclasses.asdict(cfg.prompt), "target": "no_cot_v1",
           "data_sha": file_sha(cfg.data.path), "rubrics_sha": file_sha(cfg.prompt.rubrics)}
    results = [stage_rows(store, key, lambda: sft_rows(cfg))]
    init_ray(cfg.ray)
    results.append(stage_train(store, cfg))
    table = pd.DataFrame([{"stage": r.name, "skipped": r.skipped, "rows": r.rows, "seconds": round(r.seconds, 3),
                           **{k: v for k, v in r.summary.items() if isinstance(v, (int, float, str))}}
                          for r in results])
    # finetune lora leaves a peft adapter (judge_eval: judges.N.engine.adapter), full a 16-bit model export
    # (judges.N.engine.model)
    output = "model" if cfg.train.finetune == "full" else "adapter"
    store.write_text("summary.md", "# Judge SFT (paper 003 Table 5)\n\n" + table.to_markdown(index=False) + "\n\n"
                     f"{output.capitalize()}: `{store.path}/train/run/{output}`\n")
    record_stages(results, tracker)
    store.finish({output: f"{store.path}/train/run/{output}"})
    tracker.finish()
    return table


if __name__ == "__main__":
    entry("jobs.judge.sft")
