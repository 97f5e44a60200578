"""What `quorum rehearse` changes in a config: a pure function of the config, so the rehearsal is testable without Ray.

The rehearsal is the same job through the same code at toy scale. It keeps what decides whether a job can run on its
cluster: engine kinds, ZeRO stage, LoRA ranks and targets, Serve deployments, Ray Data pool shapes (concurrency,
batch size), the reward scheme, timeouts. It swaps and cuts only what a laptop cannot hold:

| what | becomes | why |
|---|---|---|
| every hf:/local model of an engine or trainer | the bundled `smollm2-135m` | no weights are downloaded or staged |
| CRAFT's BARTScore model (`bart_model`, an encoder-decoder) | SmolLM2 with `bart_kind: causal`, as `configs/craft_demo.yaml` | no encoder-decoder is bundled; a causal LM scores log p(revision given input) through the same scorer |
| CRAFT self-training's pair filters (`rounds.min_margin`, `agent.guard`) | -1 and off, as `tests/test_craft_selftrain_job.py` | a 135M planner writes no plan the guard passes (every candidate of round 1 degenerate, 0 pairs) and the round's trainer, which the rehearsal is to reach, never ran; a rehearsal whose round still forms no pair fails |
| vLLM engines | `device: cpu`, `tensor_parallel_size: 1`, `max_model_len` <= 8192 | vLLM's CPU build, one process per engine |
| OpenAI-compatible engines | `base_url` of the rehearsal's local OpenAI server (`vllm serve` of SmolLM2) | hosted APIs are not called |
| GPUs (`use_gpu`, `num_gpus`, `gpu_type`) | none | the machine has none |
| a GPU trainer's `env_vars` | `QUORUM_REHEARSAL_BACKEND: nccl` | its CPU workers refuse what NCCL would (`train.collectives.guard_for_rehearsal`) |
| workers (`num_workers`), pool `concurrency` | at most 2 | two ranks still exercise every collective |
| a trainer's `micro_batch_size`, `grad_accum` | 1 | a global batch the few rows of a rehearsal fill |
| CPUs per actor / worker | 1 | the local cluster has few |
| each engine of a list over distinct models (a job's generators, a jury's judges, evaluation's extra systems beside its engine) but the first | its own sampling seed, and temperature 0.7 where it decodes greedily | one SmolLM2 for all of them would write the same text: nothing left to compare, pair or rejudge |
| the shared request cache (`run.request_cache`) | off | every engine runs, as on the cluster's first run, none answered from an earlier rehearsal's cache |
| rows (`limit`, `n`, ...), steps, epochs and rounds, GRPO groups, generated tokens, a trainer's prompt tokens | 4 per source, 2 GRPO steps (else 1), 1, groups of 2, 128, 1,024 | minutes, not hours; 128 tokens hold the longest verdict a judge format forces (MENLO's two pairwise grade blocks, 80) |
| data groups (CORD's `levels`, `per_level`) | the first level, one row of it | a CRAFT search per row costs minutes |
| `run.root`, `ray.*` | a local rehearsal root, a local Ray cluster | no cluster, no shared storage |

A colocated vLLM rollout keeps sleep mode (`rollout.vllm_cpu`: vLLM's CPU platform is let to accept it; its CPU
worker moves no memory). `run.rehearsal: true` marks the run directory (core.runstore).
"""

from __future__ import annotations

from collections.abc import Iterator

from train.collectives import REHEARSAL_BACKEND_ENV

REHEARSAL_MODEL = "smollm2-135m"
REHEARSAL_ROOT = "runs/rehearsals"
REHEARSAL_WORKERS = 2
# logical CPUs of the local Ray cluster: every pool and worker of the job fits at once, as on the cluster (Ray
# schedules by these counts; the processes share the machine's cores)
REHEARSAL_CPUS = 16
# rows each data source keeps; tokens a generation may take (judges and policies alike): enough for the longest
# grammar-bound verdict a shipped judge format forces (MENLO's two pairwise grade blocks after an empty <think>,
# eval.judging.grammar.reserve_tokens: 80), so a judge's verdict is never cut off and its reward comes back
ROWS = 4
MAX_TOKENS = 128
# a trainer's prompt tokens (`max_prompt_length`, kept from the end as the trainers do), as GRPO's: at craft_selftrain's
# 8,192 the logits of a chosen and a rejected sequence over SmolLM2's 49,152-token vocabulary filled the machine's
# 24 GB with two ZeRO-3 workers (Ray's OOM killer stopped round 1's training)
MAX_PROMPT_TOKENS = 1024
# SmolLM2's own context: a judge's prompt holds the paper's rubric (configs/prompts/judge_policy.yaml, over 4,096
# tokens), the source and every candidate
MAX_MODEL_LEN = 8192
# keys whose value counts rows of input (0 is "all" for each of them)
ROW_KEYS = {"limit", "n", "train_texts", "dev_texts", "probe_limit"}
# keys that count rows per group of the data (CORD's per_level: one row of each of its four levels)
PER_GROUP_KEYS = {"per_level"}
# generation budgets under their own names (CRAFT's planner and reviser), cut like max_tokens
# (a reviser's budget stays: the job refuses one that cannot rewrite its longest input)
TOKEN_KEYS = {"max_tokens", "max_completion_length", "planner_max_tokens"}
# lists that select groups of the data (CORD's levels): a rehearsal keeps the first
GROUP_LISTS = {"levels"}
ENGINE_KINDS = ("hf", "vllm", "openai")
# CRAFT self-training's pair filters in a rehearsal: a margin every pair of distinct non-empty answers clears (Eq. 1's
# S_a is >= 0), the degenerate-revision guard off, as tests/test_craft_selftrain_job.py reaches the round's trainer
PAIR_MARGIN = -1
# the temperature a greedy sibling of a swapped-in model samples at (SmolLM2 stays on topic at it)
SIBLING_TEMPERATURE = 0.7


def _walk(node, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """Every (path, value) of a YAML tree, sections and lists included (paths hold keys and list indices)."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, i))


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def is_engine(node) -> bool:
    """An engine spec as configs write it: a mapping with a `kind` among the engine kinds and a `model`."""
    return isinstance(node, dict) and node.get("kind") in ENGINE_KINDS and "model" in node


def engine_kinds(data: dict) -> dict[str, str]:
    """Each engine of the config (dotted key -> kind), as written: what the rehearsal keeps and must see run."""
    return {_key(path): node["kind"] for path, node in _walk(data) if is_engine(node)}


def _is_model_ref(value) -> bool:
    return isinstance(value, str) and (value.startswith(("hf:", "/")))


def _engine_overrides(key: str, node: dict, openai_url: str) -> list[str]:
    out = []
    if node["kind"] == "openai":
        out += [f"{key}.base_url={openai_url}", f"{key}.model={REHEARSAL_MODEL}",
                f"{key}.served_model_name={REHEARSAL_MODEL}", f"{key}.api_key_env=",
                f"{key}.structured_outputs=true"]
        return out
    if node.get("model") != REHEARSAL_MODEL:
        out.append(f"{key}.model={REHEARSAL_MODEL}")
    if node["kind"] == "vllm":
        out += [f"{key}.device=cpu", f"{key}.tensor_parallel_size=1", f"{key}.dtype=bfloat16",
                f"{key}.max_model_len={min(int(node.get('max_model_len') or MAX_MODEL_LEN), MAX_MODEL_LEN)}"]
    return out


def _scalar_overrides(key: str, name: str, value) -> list[str]:
    """The cut for one scalar by its field name (None: left as it is)."""
    if isinstance(value, bool):
        if name != "use_gpu" or not value:
            return []
        # the trainer's workers check their collectives against the device rule of the backend they have on the
        # cluster (train.collectives.guard_for_rehearsal): gloo on CPU serves what NCCL refuses
        section = key.rpartition(".")[0]
        return [f"{key}=false", f"{section + '.' if section else ''}env_vars.{REHEARSAL_BACKEND_ENV}=nccl"]
    if name in ("num_gpus",) and value:
        return [f"{key}=0"]
    if name == "gpu_type" and value:
        return [f"{key}="]
    if name in ("num_workers",) and isinstance(value, int) and value > REHEARSAL_WORKERS:
        return [f"{key}={REHEARSAL_WORKERS}"]
    if name in ("micro_batch_size", "grad_accum") and isinstance(value, int) and value > 1 and "grpo" not in key.split("."):
        return [f"{key}=1"]
    if name == "concurrency" and isinstance(value, int) and value > REHEARSAL_WORKERS and ".pool." in f".{key}.":
        return [f"{key}={REHEARSAL_WORKERS}"]
    if name in ("num_cpus", "cpus_per_worker") and isinstance(value, (int, float)) and value > 1:
        return [f"{key}=1"]
    if name in ROW_KEYS and isinstance(value, int) and (value == 0 or value > ROWS):
        return [f"{key}={ROWS}"]
    if name in PER_GROUP_KEYS and isinstance(value, int) and value != 1:
        return [f"{key}=1"]
    if name == "max_prompt_length" and isinstance(value, int) and value > MAX_PROMPT_TOKENS and "grpo" not in key.split("."):
        return [f"{key}={MAX_PROMPT_TOKENS}"]
    if name in TOKEN_KEYS and isinstance(value, int) and value > MAX_TOKENS:
        return [f"{key}={MAX_TOKENS}"]
    if name in ("epochs", "max_rounds", "rounds", "max_iterations", "max_steps", "iter_rounds") and isinstance(
            value, int) and value > 1:
        return [f"{key}=1"]
    if name == "n_boot" and isinstance(value, int) and value > 100:
        return [f"{key}=100"]
    if name == "bart_model" and _is_model_ref(value):
        section = key.rpartition(".")[0]
        return [f"{key}={REHEARSAL_MODEL}", f"{section + '.' if section else ''}bart_kind=causal"]
    if name in ("model", "ppl_model") and _is_model_ref(value):
        return [f"{key}={REHEARSAL_MODEL}"]
    return []


def grpo_overrides(key: str, grpo: dict) -> list[str]:
    """GRPO at toy scale: 2 steps of one prompt per worker, groups of 2, validated and checkpointed every step."""
    out = [f"{key}.group_size=2", f"{key}.prompts_per_step={REHEARSAL_WORKERS}", f"{key}.micro_batch_size=2",
           f"{key}.max_steps=2", f"{key}.eval_every=1", f"{key}.checkpoint_every=1", f"{key}.log_samples_every=1",
           f"{key}.max_prompt_length={min(int(grpo.get('max_prompt_length') or MAX_PROMPT_TOKENS), MAX_PROMPT_TOKENS)}",
           f"{key}.logprob_chunk_tokens=0", f"{key}.precision=fp32"]
    rollout = grpo.get("rollout") or {}
    if rollout.get("kind") == "vllm":
        out.append(f"{key}.rollout.vllm_cpu=true")
    return out


def sibling_overrides(key: str, items: list, beside: list[str] = ()) -> list[str]:
    """Keep sibling engines apart once one model replaces them all (module docstring's table).

    On the cluster a list of engines over distinct models (policy_lexical's four generators; evaluation's GPT-4o beside
    its own engine) yields distinct texts; in the rehearsal they are all SmolLM2, and greedy decoding makes them one
    system: every source's candidates are one text, the pairs stage has nothing to pair and the rejudge nothing to
    judge. `beside`: the models of the engines of the list's own section, which come first. Each engine after the first
    gets its own seed (its config's, offset by its place) and, where it decodes greedily, SIBLING_TEMPERATURE. A list
    whose engines are all one model (and the models beside it) stays as written.
    """
    if not items or not all(isinstance(i, dict) and is_engine(i.get("engine")) for i in items):
        return []
    if len({*beside, *(i["engine"]["model"] for i in items)}) < 2:
        return []
    out = []
    for index, item in enumerate(items):
        place = index + len(beside)
        if place == 0:
            continue
        sampling = item.get("sampling") or {}
        out.append(f"{key}.{index}.sampling.seed={int(sampling.get('seed', 0)) + place}")
        if float(sampling.get("temperature", 0.0)) == 0.0:
            out.append(f"{key}.{index}.sampling.temperature={SIBLING_TEMPERATURE}")
    return out


def rehearsal_overrides(data: dict, nested: dict[str, dict] | None = None, openai_url: str = "",
                        serve_port: int = 0) -> list[str]:
    """The overrides that make `data` (a job config as written) its rehearsal (module docstring).

    `nested` maps a nested job config's path (policy GRPO's `grm.config`) to its data: its own rehearsal overrides
    join the job's list of overrides for it (`grm.overrides`). `openai_url` is where the rehearsal's local
    OpenAI-compatible server listens (OpenAI engines only); `serve_port` (0: the config's) the port a Serve app of
    the job listens on, free on this machine.
    """
    nested = nested or {}
    out = ["run.rehearsal=true", f"run.root={REHEARSAL_ROOT}", "run.request_cache=false", "ray.address=", "ray.shared_storage=",
           "ray.models.hub_access=offline", "ray.models.hf_home=", f"ray.num_cpus={REHEARSAL_CPUS}", "wandb.mode=offline"]
    if "job" not in data or data.get("job") == "serve_grm":
        out = ["ray.address=", "ray.shared_storage=", "ray.models.hub_access=offline", "ray.models.hf_home="]
        out += [f"serve.port={serve_port}"] if serve_port else []
    if "rounds" in data:
        out += [f"rounds.min_margin={PAIR_MARGIN}", "agent.guard.enabled=false"]
    engines = set()
    for path, node in _walk(data):
        if not path or path[0] in ("run", "ray", "wandb", "job"):
            continue
        key = _key(path)
        if is_engine(node):
            engines.add(path)
            out += _engine_overrides(key, node, openai_url)
        elif isinstance(node, dict) and path[-1] == "grpo" and "rollout" in node:
            out += grpo_overrides(key, node)
        elif isinstance(node, dict) and path[-1] == "grm" and node.get("config") in nested:
            inner = rehearsal_overrides(nested[node["config"]], openai_url=openai_url, serve_port=serve_port)
            listed = [*(node.get("overrides") or []), *inner,
                      "resources.num_cpus=0", "autoscaling.max_replicas=1"]
            out.append(f"{key}.overrides=[{', '.join(_quoted(o) for o in listed)}]")
            out.append(f"{key}.start_timeout_s=1800")
        elif isinstance(node, list) and path[-1] in GROUP_LISTS and len(node) > 1:
            out.append(f"{key}=[{node[0]}]")
        elif isinstance(node, list):
            section = data
            for part in path[:-1]:
                section = section[part]
            out += sibling_overrides(key, node, [v["model"] for v in section.values() if is_engine(v)]
                                     if isinstance(section, dict) else [])
        elif not isinstance(node, (dict, list)):
            if any(path[:len(e)] == e for e in engines) or path[-1] == "overrides" or isinstance(path[-1], int):
                continue  # engine fields were handled with their engine; list items are data
            out += _scalar_overrides(key, str(path[-1]), node)
    return out


def _quoted(text: str) -> str:
    """One override as a YAML flow-sequence item (quoted: values hold ':' and ',')."""
    return "'" + text.replace("'", "''") + "'"
