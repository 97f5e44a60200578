"""Policy training with GRPO against the served generative reward model (paper 003 §5).

Each training prompt gets G rollouts from the policy (Qwen3: non-thinking, `grpo.thinking`); the whole group goes
to the GRM Serve app's `POST /reward/group` with the prompt's dimension and locale, so the judge sees exactly the
`menlo_pairwise` prompt it was trained on (all pairs judged; reward = the rollout's mean own grade, MENLO §5, or
its mean grade margin with `reward.signal=margin`), with retries and back-off; a group the service cannot score is
counted (``reward/groups_failed``, ``reward_service/errors/<kind>``) and left out of the loss, never given a zero
reward.

Validation (`data.val_splits`, `grpo.val_metric: vs_baseline`): MENLO's two-stage evaluation in small, one answer
per held-out prompt from the current policy against the base model's answer, judged by the GRM in both orders;
the best adapter has the highest win rate (ties half) -- see `train/grpo/validate.py`.

Local (local Ray; this job starts the GRM app in its own cluster, as `quorum serve` would, unless `reward.url`
names a running one; SmolLM2-135M as policy and judge; the demo measured 7 min 27 s for 3 steps on 2 cores
shared with other jobs at load average ~30, ~40 s per step, the rest start-up):

    quorum run configs/policy_grpo_demo.yaml
    python -m jobs.policy.grpo configs/policy_grpo_demo.yaml grpo.max_steps=2 run.id=short
    quorum serve configs/grm.yaml &                                     # or use a running GRM app:
    QUORUM_SERVE_TOKEN=... quorum run configs/policy_grpo_demo.yaml reward.url=http://127.0.0.1:8000 \\
        reward.token_env=QUORUM_SERVE_TOKEN

On a cluster (the paper's settings: G = 8, 32 prompts per step, lr 1e-6, 1024-token answers, Dr. GRPO):

    quorum submit configs/policy_grpo_cluster.yaml --address http://HEAD:8265 --home /mnt/shared/quorum
    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env-json "$RUNTIME_ENV" -- \\
        quorum run configs/policy_grpo_cluster.yaml run.root=/shared/runs reward.url=http://grm.internal:8000

Stages (under <run.root>/policy_grpo/<run-id>/, skipped when already complete): rows (the unique prompts of the
MENLO-format pairs of `data.dimensions`, a seeded random sample of `data.limit`, each with what the GRM reads)
-> train (GRPO on Ray Train + DeepSpeed + LoRA) -> summary.md. The GRM app is started only when `train` runs, and
deleted when it ends. The training workers call that app through a Ray Serve DeploymentHandle
(`reward.app`, set by the job), which reaches a replica on any node: Ray 2.60 runs HTTP proxies only on the head
and on nodes holding a replica, so `http://127.0.0.1` on a GPU node without one reaches nothing. Its HTTP address
(logged) stays for clients outside the cluster; an external service (`reward.url`) is called over HTTP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from core.config import ConfigError, load_config, require_file
from core.jobrun import JobSections, open_run
from core.ray_env import init_ray
from eval.judging.listwise import MAX_LISTWISE
from eval.judging.menlo_data import DIMENSIONS, load_rubrics, read_menlo_jsonl, render_criteria
from eval.monitor_config import MonitorConfig
from eval.prompts import load_template, prompt_path
from eval.reward_monitors import JudgeMarkers, gold_preference, judge_markers
from jobs.entry import entry
from jobs.grpo_stages import (
    SAMPLES,
    GRPOData,
    adapter_dir,
    file_sha,
    limit_rows,
    report,
    stage_rows,
    stage_train,
    train_val_rows,
    validate_grpo,
)
from serve.config import ServeConfig, run_app_name, run_route_prefix
from train.config import GRPOConfig
from train.grpo.monitoring import record_alert
from train.grpo.reward.client import RewardServiceConfig
from train.grpo.reward.same_family import model_identity, same_family
from train.grpo.reward.wait import check_phase_wait, probe_wait, step_wait, validation_wait

log = logging.getLogger("quorum.policy_grpo")
JOB = "policy_grpo"


@dataclass
class DataConfig(GRPOData):
    """The policy trains on the pairs' prompts (rows = distinct prompts; paper: 3,000 prompts sampled from MENLO).
    `limit` / `val_limit` keep N prompts chosen by `sample`."""

    # paper §5 trains on Fluency, Tone and Localized Tone (localized factuality excluded)
    dimensions: list[str] = field(default_factory=lambda: ["fluency", "tone", "localized_tone"])
    # random: a seeded sample of `limit` prompts (paper: "randomly sample"); head: the first `limit` in file order
    sample: str = "random"
    seed: int = 0  # seed of the random prompt sample (limit / val_limit with sample random)
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
    # a fully fine-tuned judge (a judge_grpo run's train/run/model, its 16-bit export), applied as judge.model;
    # "" = as configured
    model: str = ""
    start_timeout_s: float = 600.0  # seconds to wait for the deployed GRM app to be RUNNING before the job fails


@dataclass
class Config(JobSections):
    data: DataConfig = field(default_factory=DataConfig)
    grm: GRMConfig = field(default_factory=GRMConfig)  # the GRM app the job deploys when reward.url is empty
    # how the workers reach the GRM (URL or Serve handle) and turn its verdicts into rollout rewards
    reward: RewardServiceConfig = field(default_factory=RewardServiceConfig)
    # a YAML `grpo:` section starts from GRPOConfig's own defaults: the configs repeat these paper values
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(loss_agg="seq_mean_token_sum_norm",
                                                                normalize_std=False, max_completion_length=1024,
                                                                thinking=False, val_metric="vs_baseline"))
    # reward-hacking monitors (eval.reward_monitors, docs/monitors.md): on by default
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def validate(self) -> None:
        self.data.validate_data()
        require_file(self.data.rubrics, "data.rubrics")
        if self.data.sample not in SAMPLES:
            raise ConfigError(f"data.sample: {self.data.sample!r} is not one of {list(SAMPLES)}")
        if not self.data.dimensions or any(d not in DIMENSIONS for d in self.data.dimensions):
            raise ConfigError(f"data.dimensions: need a non-empty subset of {list(DIMENSIONS)}, "
                              f"got {self.data.dimensions}")
        if self.monitor.probe_path:
            require_file(self.monitor.probe_path, "monitor.probe_path")
        if self.reward.app and not self.reward.url:
            raise ConfigError("reward.app: names a GRM app already running in this job's Ray cluster; give its HTTP "
                              "address too (reward.url), or leave both empty and the job deploys the GRM itself")
        # a slow judge must cost one step, not the worker group: a step's, a validation pass's and rank 0's probe's
        # worst wait stay under the collective timeout (train.grpo.reward.wait); the last two counts read their files
        val_prompts = val_prompt_count(self)
        for wait in (step_wait(self.grpo, self.reward), validation_wait(self.grpo, self.reward, val_prompts, self.data.val_limit),
                     probe_wait(self.grpo, self.reward, probe_pair_count(self), self.monitor.probe_limit,
                                self.monitor.probe_path, val_prompts, self.data.val_limit)):
            if wait is not None:
                check_phase_wait(wait, self.reward, self.grpo.collective_timeout_s)
        if self.reward.scheme == "listwise" and not 2 <= self.grpo.group_size <= MAX_LISTWISE:
            raise ConfigError(f"reward.scheme: listwise ranks 2..{MAX_LISTWISE} responses in one call; "
                              f"grpo.group_size is {self.grpo.group_size}")
        if not self.reward.url:
            serve_cfg = self.serve_config()  # a bad GRM config stops the run here, before any work
            if self.reward.scheme == "listwise" and not serve_cfg.prompts.listwise:
                raise ConfigError("reward.scheme: listwise needs a listwise template in the GRM config "
                                  "(grm.overrides: prompts.listwise=menlo_listwise)")
        self.run.require_local()

    def serve_config(self) -> ServeConfig:
        require_file(self.grm.config, "grm.config")
        try:
            if self.grm.adapter and self.grm.model:
                raise ConfigError("grm.model: a fully fine-tuned judge has no adapter; set grm.model or grm.adapter")
            extra = [f"judge.adapter={self.grm.adapter}"] if self.grm.adapter else []
            extra += [f"judge.model={self.grm.model}"] if self.grm.model else []
            return load_config(ServeConfig, self.grm.config, [*self.grm.overrides, *extra])
        except ConfigError as exc:
            raise ConfigError(f"grm: {exc}") from None


def val_prompt_count(cfg: Config) -> int:
    """The validation prompts `policy_rows` will hold (0 without data.val_splits)."""
    if not cfg.data.val_splits:
        return 0
    pairs = distinct_prompts(cfg, cfg.data.val_splits)
    return min(len(pairs), cfg.data.val_limit) if cfg.data.val_limit else len(pairs)  # what limit_rows keeps


def probe_pair_count(cfg: Config) -> int:
    """The probe pairs `probe_pairs` will send (0 when no probe runs)."""
    if not (cfg.monitor.enabled and cfg.monitor.probe_path):
        return 0
    return min(len(read_menlo_jsonl(cfg.monitor.probe_path)), cfg.monitor.probe_limit)


def probe_pairs(cfg: Config) -> list[dict]:
    """The probe set of `monitor.probe_path` as the workers send it (train.grpo.monitoring.ProbeSet): the judge
    prompt as the training rows carry it (reward.send_context), both responses and the gold preference."""
    pairs = read_menlo_jsonl(cfg.monitor.probe_path).head(cfg.monitor.probe_limit)
    rubrics = load_rubrics(cfg.data.rubrics)
    return [{
        "judge_prompt": (row["prompt"] if cfg.reward.send_context
                         else judge_task(row["locale"], rubrics[row["dimension"]], row["prompt"])),
        "dimension": row["dimension"], "locale": row["locale"], "response_a": row["response_a"],
        "response_b": row["response_b"], "gold": gold_preference(int(row["gold_a"]), int(row["gold_b"])),
    } for row in pairs.to_dict("records")]


def judge_task(locale: str, rubric: dict, prompt: str) -> str:
    """The request's `prompt` for a template without MENLO context slots (reward.send_context=false, e.g.
    configs/prompts/menlo_grpo_grm.yaml's {task}): locale, dimension and question written into the prompt."""
    return (f"[Locale]\n{locale}\n\n[Dimension]\n{rubric['name']}: {rubric['question']}\n\n"
            f"[User Prompt]\n{prompt}")


def policy_rows(cfg: Config) -> pd.DataFrame:
    """Training prompts (`role` train) and, with data.val_splits, validation prompts (`role` val)."""
    return train_val_rows(cfg.data, functools.partial(policy_rows_of, cfg))


def policy_rows_of(cfg: Config, splits: list[str], limit: int) -> pd.DataFrame:
    """One row per distinct (dimension, locale, prompt) of the selected pairs (`data.limit` of them, sampled).

    ``judge_prompt`` is what the GRM's template fills {prompt} with: the user prompt itself, its dimension and
    locale travelling as the request's own fields (reward.send_context), as in judge training's rows."""
    pairs = limit_rows(distinct_prompts(cfg, splits), limit, cfg.data.sample, cfg.data.seed, key="pair_id")
    if pairs.empty:
        raise ConfigError(f"data: no prompts left in {cfg.data.path} for splits {splits} and dimensions "
                          f"{cfg.data.dimensions}")
    rubrics = load_rubrics(cfg.data.rubrics)
    return pd.DataFrame([{
        "id": row["pair_id"], "dimension": row["dimension"], "locale": row["locale"],
        "prompt_messages": json.dumps([{"role": "user", "content": row["prompt"]}], ensure_ascii=False),
        "judge_prompt": (row["prompt"] if cfg.reward.send_context
                         else judge_task(row["locale"], rubrics[row["dimension"]], row["prompt"])),
    } for row in pairs.to_dict("records")])


def distinct_prompts(cfg: Config, splits: list[str]) -> pd.DataFrame:
    """The pairs of `splits` and data.dimensions, one per distinct (dimension, locale, prompt)."""
    pairs = read_menlo_jsonl(cfg.data.path)
    pairs = pairs[pairs["split"].isin(splits) & pairs["dimension"].isin(cfg.data.dimensions)]
    return pairs.drop_duplicates(["dimension", "locale", "prompt"])


@contextlib.contextmanager
def served_reward(cfg: Config, run_id: str = ""):
    """Yield (reward spec, secret worker env): the configured service, or a GRM app deployed here and deleted after.

    The deployed app is this run's own: `serve.app_name` plus the run id (`serve.config.run_app_name`), under its
    own route prefix, held by this driver while it runs (`jobs.serve_grm.claim_app`): another live run of the same
    id is refused (ConfigError), never silently redeployed, and on exit this run deletes only its own app. It is
    called through a DeploymentHandle (`reward.app`): no HTTP proxy on the workers' nodes and no bearer token
    needed, so no secret goes to the workers; an external `reward.url` gets its token. `run_id` "" = `run.id` (or
    "default", as `core.jobrun.open_run` names a run without one)."""
    from jobs.serve_grm import claim_app, release_app

    run_id = run_id or cfg.run.id or "default"
    reward, app, owner = cfg.reward, None, None
    if not reward.url:
        serve_cfg = cfg.serve_config()
        app = run_app_name(serve_cfg.serve.app_name, run_id)
        owner = claim_app(app)
        try:
            url = start_grm(serve_cfg, app, cfg.grm.start_timeout_s)
        except BaseException:
            _delete_app(app)
            release_app(owner)
            raise
        reward = dataclasses.replace(reward, url=url, app=app, token_env="")
    secret = {reward.token_env: os.environ[reward.token_env]} if reward.token_env and not reward.app else {}
    spec = {"kind": "grm", "config": dataclasses.asdict(reward)}
    if cfg.monitor.enabled:  # the workers run the monitors (train.grpo.monitoring) on what the judge returns
        spec["monitor"] = {"config": dataclasses.asdict(cfg.monitor), "markers": judge_markers_of(cfg).to_dict()}
        if cfg.monitor.probe_path:
            spec["monitor"]["probe"] = probe_pairs(cfg)
    try:
        yield spec, secret
    finally:
        if app is not None:
            _delete_app(app)
            release_app(owner)


def _delete_app(app: str) -> None:
    from ray import serve

    serve.delete(app)


def judge_markers_of(cfg: Config) -> JudgeMarkers:
    """What a rollout quoting the judge would contain: the GRM config's pairwise template (its output tags and
    keywords, its instructions) and its rubrics' definitions, questions and criteria. With an external
    `reward.url` these are grm.config's, the template that service is expected to run."""
    prompts = cfg.serve_config().prompts
    template = load_template(prompt_path(prompts.pairwise))
    rubric_texts = []
    for rubric in (load_rubrics(prompts.rubrics).values() if prompts.rubrics else ()):
        rubric_texts += [rubric.get("definition", ""), rubric.get("question", ""), render_criteria(rubric, True)]
    return judge_markers("\n".join(m["content"] for m in template.messages), rubric_texts, cfg.monitor.format_ngram)


def same_family_check(cfg: Config, tracker) -> list[dict]:
    """The start-of-run warning when the policy and the judge share a family, base model or tokenizer (the judge
    may prefer its own family's style); [] when they do not, or the judge behind an external reward.url is not
    known here."""
    if not (cfg.monitor.enabled and cfg.monitor.same_family):
        return []
    if cfg.reward.url:
        log.info("monitor.same_family: the judge behind reward.url %s is not known to this job; not checked",
                 cfg.reward.url)
        return []
    judge = cfg.serve_config().judge.engine.model
    alert = same_family(*(model_identity(name, name if os.path.isdir(name) else "") for name in (cfg.grpo.model,
                                                                                                 judge)))
    if alert is None:
        return []
    record_alert(alert, getattr(tracker, "run", None))
    return [alert.as_dict()]


def start_grm(serve_cfg: ServeConfig, app: str, timeout_s: float) -> str:
    """Deploy the GRM app as `app` under its own route prefix in the connected Ray cluster (as `quorum serve
    --detach` would); return its base URL. The caller holds `app` (`jobs.serve_grm.claim_app`): an app of that name
    that exists already was left by a stopped driver of this run and is replaced."""
    from ray import serve

    from jobs.serve_grm import existing_app, wait_until_running
    from serve.app import check_replicas_fit, make_app

    http = serve_cfg.serve
    prefix = run_route_prefix(http.route_prefix, app)
    serve.start(http_options={"host": http.host, "port": http.port})
    check_replicas_fit(serve_cfg)
    if existing_app(app) is not None:
        log.warning("Serve app %r exists but no running job holds it (a stopped run of this id left it): replacing "
                    "it", app)
    serve.run(make_app(serve_cfg), name=app, route_prefix=prefix, blocking=False)
    wait_until_running(app, timeout_s)
    url = f"http://{proxy_host(http.host)}:{http.port}{prefix}"
    log.info("GRM app %r running; training workers call it through a Serve handle, HTTP clients at %s", app, url)
    return url


def placement(cfg: Config) -> list:
    """What the job places at once (`core.resource_fit.Ask`s): the training workers and, when it deploys the GRM,
    the app's replicas (`min_replicas`), which serve the judge for the whole of training."""
    from train.trainer import workers_ask

    asks = [workers_ask(cfg.grpo, "grpo")]
    if not cfg.reward.url:
        asks.append(cfg.serve_config().replicas_ask("grm.overrides: "))
    return asks


def check_before_work(cfg: Config, run_id: str) -> None:
    """With Ray connected, before the run directory exists: the job's GPUs and CPUs at once fit the cluster (or its
    autoscaler's limits), and no live job holds this run's Serve app. Each raises ConfigError (exit 2)."""
    from actors.ray_capacity import ensure_all_fit
    from jobs.serve_grm import check_app_free

    ensure_all_fit(placement(cfg))
    if not cfg.reward.url:
        check_app_free(run_app_name(cfg.serve_config().serve.app_name, run_id))


def proxy_host(host: str) -> str:
    """Where HTTP clients find the app: Serve always runs a proxy on the head node (the controller's), bound to
    `serve.host`; a wildcard bind is reached at the head's address."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    import ray

    heads = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]]
    return heads[0] if heads else "127.0.0.1"


def main(cfg: Config, config_path: str = "") -> pd.DataFrame:
    # checked here, not in validate(): the config is fine, the shell it runs in lacks the secret
    if cfg.reward.token_env and not cfg.reward.app and not os.environ.get(cfg.reward.token_env):
        raise ConfigError(f"reward.token_env: environment variable {cfg.reward.token_env} is not set")
    # bad data fails before the run directory (and its manifest) exists
    validate_grpo(cfg.grpo, int((policy_rows(cfg)["role"] == "train").sum()))
    init_ray(cfg.ray)
    # the run id open_run gives the run (core.jobrun)
    check_before_work(cfg, cfg.run.id or (Path(config_path).stem if config_path else "default"))
    run = open_run(JOB, cfg, config_path)
    store, tracker = run.store, run.start_tracking(JOB, cfg.wandb)
    rows_key = {"data": dataclasses.asdict(cfg.data), "data_sha": file_sha(cfg.data.path),
                "send_context": cfg.reward.send_context}
    family = same_family_check(cfg, tracker)
    results = [stage_rows(store, rows_key, lambda: policy_rows(cfg))]
    validate_grpo(cfg.grpo, results[0].summary["train_rows"])
    # the judge (config + overrides) or the external URL decides the rewards, so both are part of the stage hash
    # (reward.app and reward.overlap are not: they pick how and when the workers ask, not what the service answers)
    reward_key = {k: v for k, v in dataclasses.asdict(cfg.reward).items() if k not in ("app", "overlap")}
    key = {"grpo": dataclasses.asdict(cfg.grpo), "reward": reward_key,
           "grm": dataclasses.asdict(cfg.serve_config()) if not cfg.reward.url else None}
    results.append(stage_train(store, cfg.grpo, cfg.wandb, key, lambda: served_reward(cfg, run.run_id)))
    table = report(store, tracker, results, "Policy GRPO against the served GRM")
    best = results[-1].summary.get("best_adapter")
    store.finish({"adapter": adapter_dir(store), **({"best_adapter": best} if best else {}),
                  **({"monitor_start_alerts": family} if family else {})})
    tracker.finish()
    return table


if __name__ == "__main__":
    entry("jobs.policy.grpo")
