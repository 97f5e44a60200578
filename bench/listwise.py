"""Listwise vs pairwise judging of GRPO groups: one judge call per group against the n(n-1)/2 calls of all_pairs.

    nice python -m bench.listwise                          # 8 groups of 4, SmolLM2-135M on CPU (hf), constrained
    python -m bench.listwise --groups 16 --group-size 4 --max-tokens 64 --model smollm2-135m

Groups come from the MENLO fixture (`configs/data/menlo_fixture.jsonl`): for a prompt, its own two responses plus
the two responses of the next pair with the same dimension and locale (answers to another prompt, which a judge
should place last), in a seeded random order. The judge is the GRM service's own code without HTTP: `configs/grm.yaml`'s templates
(`menlo_pairwise`, `menlo_listwise`), `serve.judge_prompts` rendering, the verdict grammars (`eval.judging.grammar`
pairwise, `eval.judging.listwise` permutation), `serve.rewards` (all_pairs margins; listwise normalised ranks) and the
served engine (`serve.adapter.build_judge_engine`). Each group's requests go to the engine in one batched call on
each side. Greedy, so both sides are deterministic.

Prints `bench <name> = <value>`:

- `listwise_tau_vs_pairwise` (+ `_ci_lo`, `_ci_hi`): mean Kendall tau-b between the listwise ranking and the
  all_pairs mean-margin ranking per group, 95% percentile bootstrap CI over groups (2000 resamples); groups where
  a side has no reward (a failed parse) or the pairwise side is all ties are left out and counted
  (`listwise_groups_left_out`);
- `{pairwise,listwise}_calls_per_group`, `_tokens_per_group` (prompt + completion), `_seconds_per_group`;
- `{pairwise,listwise}_tau_vs_gold` (+ CI, `_groups`): each side's ranking against the fixture's gold (the own
  pair's gold grades; the other prompt's answers below both), over the groups where tau is defined;
- `listwise_tau_vs_reversed_order` (+ CI): the control. Each group is ranked again with its responses shown in
  reverse order (not counted in the per-group costs); tau between the two rankings, mapped back to the responses,
  is 1 for a judge that ranks by content and -1 for one that ranks by slot;
- `listwise_speedup`: pairwise seconds per group / listwise seconds per group, measured in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import time
from pathlib import Path

from actors.engines.base import ChatRequest
from core.config import load_config
from eval.judging.grammar import judge_grammar
from eval.judging.listwise import kendall_tau_b, listwise_grammar
from serve import rewards as R
from serve.adapter import build_judge_engine
from serve.config import ServeConfig, load_prompts

REPO = Path(__file__).resolve().parents[1]


def menlo_groups(path: Path, count: int, size: int, seed: int = 0) -> list[dict]:
    """Up to `count` groups of `size` responses (see module docstring): the own pair and other pairs' answers of
    the same dimension and locale, shown in a random order seeded by (`seed`, pair id)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    groups = []
    for i, row in enumerate(rows):
        peers = [r for r in rows[i + 1:] + rows[:i] if (r["dimension"], r["locale"]) == (row["dimension"],
                                                                                      row["locale"])]
        responses = [row["response_a"], row["response_b"]]
        for peer in peers:
            responses += [peer["response_a"], peer["response_b"]]
        if len(responses) >= size:
            # gold: the fixture's grades of the own pair; answers to another prompt rank below both (0)
            gold = [row["gold_a"], row["gold_b"]] + [0] * (size - 2)
            # shown in a seeded random order: a judge that ranks by slot must not agree with gold by construction
            order = list(range(size))
            random.Random(f"{seed}:{row['pair_id']}").shuffle(order)
            groups.append({"prompt": row["prompt"], "dimension": row["dimension"], "locale": row["locale"],
                           "responses": [responses[k] for k in order], "gold": [gold[k] for k in order]})
        if len(groups) == count:
            break
    return groups


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def print_mean_ci(name: str, values: list[float]) -> None:
    """`bench <name>` lines: the mean of `values` and its 95% bootstrap interval (nothing when there are none)."""
    if values:
        lo, hi = bootstrap_ci(values)
        print(f"bench {name} = {statistics.fmean(values):.3f}")
        print(f"bench {name}_ci_lo = {lo:.3f}")
        print(f"bench {name}_ci_hi = {hi:.3f}")


def judge(engine, requests: list[ChatRequest]):
    started = time.perf_counter()
    completions = engine.generate(requests)
    return completions, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    cfg = load_config(ServeConfig, REPO / "configs" / "grm.yaml", [
        f"judge.engine.model={args.model}", f"judge.engine.num_threads={args.threads}",
        f"sampling.max_tokens={args.max_tokens}", "prompts.listwise=menlo_listwise", "prompts.listwise_mode=rank"])
    prompts = load_prompts(cfg.prompts)
    sampling = cfg.sampling.to_params()
    engine = build_judge_engine(cfg.judge)

    n = args.group_size
    pair_sampling = dataclasses.replace(sampling, grammar=judge_grammar("pairwise", args.max_tokens))
    list_sampling = dataclasses.replace(sampling, grammar=listwise_grammar(n, "rank", args.max_tokens))
    groups = menlo_groups(REPO / "configs" / "data" / "menlo_fixture.jsonl", args.groups, n)
    taus, order_taus, left_out = [], [], 0
    gold_taus = {"pairwise": [], "listwise": []}
    sides = {side: {"calls": 0, "tokens": 0, "seconds": 0.0} for side in ("pairwise", "listwise")}
    for group in groups:
        ctx = (group["dimension"], group["locale"])
        pairs = R.plan_pairs(n, "all_pairs")
        requests = [ChatRequest(prompts.compare_messages(group["prompt"], group["responses"][a],
                                                         group["responses"][b], *ctx), pair_sampling)
                    for a, b in pairs]
        completions, seconds = judge(engine, requests)
        judgments = [R.read_judgment(a, b, c) for (a, b), c in zip(pairs, completions)]
        pairwise = R.group_response("all_pairs", n, judgments, completions, "bench")
        sides["pairwise"]["calls"] += len(requests)
        sides["pairwise"]["tokens"] += pairwise.usage.total_tokens
        sides["pairwise"]["seconds"] += seconds

        request = ChatRequest(prompts.listwise_messages(group["prompt"], group["responses"], *ctx), list_sampling)
        completions, seconds = judge(engine, [request])
        listwise = R.listwise_response(n, "rank", completions[0], False, "bench")
        sides["listwise"]["calls"] += 1
        sides["listwise"]["tokens"] += listwise.usage.total_tokens
        sides["listwise"]["seconds"] += seconds

        # control: the same group shown in reverse order; a judge that ranks by slot scores -1 here
        back = ChatRequest(prompts.listwise_messages(group["prompt"], group["responses"][::-1], *ctx), list_sampling)
        reversed_rewards = R.listwise_response(n, "rank", judge(engine, [back])[0][0], False, "bench").rewards
        if None not in listwise.rewards and None not in reversed_rewards:
            order_taus.append(kendall_tau_b(listwise.rewards, reversed_rewards[::-1]))

        for side, rewards in (("pairwise", pairwise.rewards), ("listwise", listwise.rewards)):
            if None not in rewards:
                gold_tau = kendall_tau_b(rewards, group["gold"])
                if not math.isnan(gold_tau):
                    gold_taus[side].append(gold_tau)

        tau = math.nan
        if None not in pairwise.rewards and None not in listwise.rewards:
            tau = kendall_tau_b(listwise.rewards, pairwise.rewards)
        if math.isnan(tau):
            left_out += 1
        else:
            taus.append(tau)
        print(f"group {len(taus) + left_out}: pairwise {pairwise.rewards} listwise {listwise.rewards} "
              f"({listwise.listwise.parse_status}) tau {tau:.3f}", flush=True)
    engine.close()

    print(f"bench listwise_groups = {len(groups)}")
    print(f"bench listwise_group_size = {n}")
    print(f"bench listwise_groups_left_out = {left_out}")
    print_mean_ci("listwise_tau_vs_pairwise", taus)
    for side, values in gold_taus.items():
        print(f"bench {side}_tau_vs_gold_groups = {len(values)}")
        print_mean_ci(f"{side}_tau_vs_gold", values)
    print_mean_ci("listwise_tau_vs_reversed_order", order_taus)
    for side, totals in sides.items():
        for key, value in totals.items():
            print(f"bench {side}_{key}_per_group = {value / max(len(groups), 1):.2f}")
    if sides["listwise"]["seconds"]:
        print(f"bench listwise_speedup = {sides['pairwise']['seconds'] / sides['listwise']['seconds']:.2f}")


if __name__ == "__main__":
    main()
