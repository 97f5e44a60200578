"""Policy training with GRPO against the served generative reward model (paper 003 §5).

Each training prompt gets G rollouts from the policy; the whole group goes to the GRM Serve app's
`POST /reward/group` (all pairs judged with MENLO's pairwise format, reward = mean grade margin), with retries and
back-off; a group the service cannot score is counted (``reward/groups_failed``, ``reward_service/errors/<kind>``)
and left out of the loss, never given a zero reward.

Local (local Ray; this job starts the GRM app in its own cluster, as `quorum serve` would, unless `reward.url`
names a running one; SmolLM2-135M as policy and judge; the demo measured 7 min 27 s for 3 steps on 2 cores
shared with other jobs at load average ~30, ~40 s per step, the rest start-up):

    quorum run configs/policy_grpo_demo.yaml
    python -m jobs.policy_grpo configs/policy_grpo_demo.yaml grpo.max_steps=2 run.id=short
    quorum serve configs/grm.yaml &                                     # or use a running GRM app:
    QUORUM_SERVE_TOKEN=... quorum run configs/policy_grpo_demo.yaml reward.url=http://127.0.0.1:8000 \\
        reward.token_env=QUORUM_SERVE_TOKEN

On a cluster (the paper's settings: G = 8, 32 prompts per step, lr 1e-6, 1024-token answers, Dr. GRPO):

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \\
        quorum run configs/policy_grpo_cluster.yaml run.root=/shared/runs reward.url=http://grm.internal:8000

Stages (under <run.root>/policy_grpo/<run-id>/, skipped when already complete): rows (the unique prompts of the
MENLO-format pairs of `data.dimensions`, each with the judge task the GRM sees: locale, dimension question, prompt)
-> train (GRPO on Ray Train + DeepSpeed + LoRA) -> summary.md. The GRM app is started only when `train` runs, and
deleted when it ends. Its URL for the workers is 127.0.0.1 on their own node: Serve runs an HTTP proxy per node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

import pandas as pd

from core.config import ConfigError, load_config, require_file
from core.jobrun import JobSections, open_run
from core.ray_env import init_ray
from eval.menlo_data import DIMENSIONS, load_rubrics, read_menlo_jsonl
from jobs.cli import entry
from jobs.grpo_stages import GRPOData, adapter_dir, file_sha, report, stage_rows, stage_train, validate_grpo
from serve.config import ServeConfig
from train.config import GRPOConfig
from train.reward_client import RewardServiceConfig

log = logging.getLogger("quorum.policy_grpo")
JOB = "policy_grpo"


@dataclass
class DataConfig(GRPOData):
    """The policy trains on the pairs' prompts (rows = distinct prompts; paper: 3,000 prompts sampled from MENLO)."""

    # paper §5 trains on Fluency, Tone and Localized Tone (localized factuality excluded)
    dimensions: list[str] = field(default_factory=lambda: ["fluency", "tone", "localized_tone"])
    # dimension names and key questions shown to the GRM
    rubrics: str = "configs/data/menlo_rubrics.yaml"


@dataclass
class GRMConfig:
    # the GRM Serve config the job deploys when reward.url is empty (configs/grm.yaml format)
    config: str = "configs/grm.yaml"
    # key=value overrides of that config, as on the `quorum serve` command line
    overrides: list[str] = field(default_factory=list)
    # the judge's LoRA adapter (a judge_grpo run's train/run/adapter), applied as judge.adapter; "" = as configured
    adapter: str = ""
    start_timeout_s: float = 600.0


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)
    grm: GRMConfig = field(default_factory=GRMConfig)
    reward: RewardServiceConfig = field(default_factory=RewardServiceConfig)
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(loss_agg="seq_mean_token_sum_norm",
                                                                normalize_std=False, max_completion_length=1024))

    def validate(self) -> None:
        self.data.validate_data()
        require_file(self.data.rubrics, "data.rubrics")
        if not self.data.dimensions or any(d not in DIMENSIONS for d in self.data.dimensions):
            raise ConfigError(f"data.dimensions: need a non-empty subset of {list(DIMENSIONS)}, "
                              f"got {self.data.dimensions}")
        try:
            self.reward.validate("reward")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.reward.url:
            self.serve_config()  # a bad GRM config stops the run here, before any work
        self.wandb.validate()
        self.run.require_local()
        validate_grpo(self.grpo)

    def serve_config(self) -> ServeConfig:
        require_file(self.grm.config, "grm.config")
        try:
            extra = [f"judge.adapter={self.grm.adapter}"] if self.grm.adapter else []
            return load_config(ServeConfig, self.grm.config, [*self.grm.overrides, *extra])
        except ConfigError as exc:
            raise ConfigError(f"grm: {exc}") from None


def judge_task(locale: str, rubric: dict, prompt: str) -> str:
    """What the GRM sees as the request's `prompt` (configs/prompts/menlo_grpo_grm.yaml's {task})."""
    return (f"[Locale]\n{locale}\n\n[Dimension]\n{rubric['name']}: {rubric['question']}\n\n"
            f"[User Prompt]\n{prompt}")


def policy_rows(cfg: Config) -> pd.DataFrame:
    """Training prompts (`role` train) and, with data.val_splits, validation prompts (`role` val)."""
    frames = [policy_rows_of(cfg, cfg.data.splits, cfg.data.limit).assign(role="train")]
    if cfg.data.val_splits:
        frames.append(policy_rows_of(cfg, cfg.data.val_splits, cfg.data.val_limit).assign(role="val"))
    return pd.concat(frames, ignore_index=True)


def policy_rows_of(cfg: Config, splits: list[str], limit: int) -> pd.DataFrame:
    """One row per distinct (dimension, locale, prompt) of the selected pairs."""
    pairs = read_menlo_jsonl(cfg.data.path)
    pairs = pairs[pairs["split"].isin(splits) & pairs["dimension"].isin(cfg.data.dimensions)]
    pairs = pairs.drop_duplicates(["dimension", "locale", "prompt"]).head(limit or None)
    if pairs.empty:
        raise ConfigError(f"data: no prompts left in {cfg.data.path} for splits {splits} and dimensions "
                          f"{cfg.data.dimensions}")
    rubrics = load_rubrics(cfg.data.rubrics)
    return pd.DataFrame([{
        "id": row["pair_id"], "dimension": row["dimension"], "locale": row["locale"],
        "prompt_messages": json.dumps([{"role": "user", "content": row["prompt"]}], ensure_ascii=False),
        "judge_prompt": judge_task(row["locale"], rubrics[row["dimension"]], row["prompt"]),
    } for row in pairs.to_dict("records")])


@contextlib.contextmanager
def served_reward(cfg: Config):
    """Yield (reward spec, secret worker env): the configured service, or a GRM app deployed here and deleted after."""
    reward, app = cfg.reward, None
    if not reward.url:
        serve_cfg = cfg.serve_config()
        app = serve_cfg.serve.app_name
        url = start_grm(serve_cfg, cfg.grm.start_timeout_s)
        # the app reads its token from serve.auth_token_env; without that variable set it runs without auth
        token_env = serve_cfg.serve.auth_token_env
        reward = dataclasses.replace(reward, url=url,
                                     token_env=reward.token_env or (token_env if os.environ.get(token_env) else ""))
    secret = {reward.token_env: os.environ[reward.token_env]} if reward.token_env else {}
    try:
        yield {"kind": "grm", "config": dataclasses.asdict(reward)}, secret
    finally:
        if app is not None:
            from ray import serve

            serve.delete(app)


def start_grm(serve_cfg: ServeConfig, timeout_s: float) -> str:
    """Deploy the GRM app in the connected Ray cluster (as `quorum serve --detach` would); return its base URL."""
    from ray import serve

    from jobs.serve_grm import wait_until_running
    from serve.app import make_app

    http = serve_cfg.serve
    serve.start(http_options={"host": http.host, "port": http.port})
    serve.run(make_app(serve_cfg), name=http.app_name, route_prefix=http.route_prefix, blocking=False)
    wait_until_running(http.app_name, timeout_s)
    url = f"http://127.0.0.1:{http.port}{http.route_prefix.rstrip('/')}"
    log.info("GRM app %r running at %s", http.app_name, url)
    return url


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    # checked here, not in validate(): the config is fine, the shell it runs in lacks the secret
    if cfg.reward.token_env and not os.environ.get(cfg.reward.token_env):
        raise ConfigError(f"reward.token_env: environment variable {cfg.reward.token_env} is not set")
    # bad data fails before the run directory (and its manifest) exists
    validate_grpo(cfg.grpo, int((policy_rows(cfg)["role"] == "train").sum()))
    run = open_run(JOB, cfg, config_path)
    store, tracker = run.store, run.start_tracking(JOB, cfg.wandb)
    rows_key = {"data": dataclasses.asdict(cfg.data), "data_sha": file_sha(cfg.data.path)}
    results = [stage_rows(store, rows_key, lambda: policy_rows(cfg))]
    validate_grpo(cfg.grpo, results[0].summary["train_rows"])
    init_ray(cfg.ray)
    # the judge (config + overrides) or the external URL decides the rewards, so both are part of the stage hash
    key = {"grpo": dataclasses.asdict(cfg.grpo), "reward": dataclasses.asdict(cfg.reward),
           "grm": dataclasses.asdict(cfg.serve_config()) if not cfg.reward.url else None}
    results.append(stage_train(store, cfg.grpo, cfg.wandb, key, lambda: served_reward(cfg)))
    table = report(store, tracker, results, "Policy GRPO against the served GRM")
    best = results[-1].summary.get("best_adapter")
    store.finish({"adapter": adapter_dir(store), **({"best_adapter": best} if best else {})})
    tracker.finish()
    return table


if __name__ == "__main__":
    entry("jobs.policy_grpo")
