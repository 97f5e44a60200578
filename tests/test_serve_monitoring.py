"""The reward service's per-caller monitors (serve/monitoring.py) and the pure pieces of its trainer routes: steps
given or counted, stragglers, null rewards, the record, the caller limit; OpenRLHF's response recovery."""

from __future__ import annotations

import pytest

from core.config import ConfigError, check_tree
from serve.monitoring import CallerLedger, ServiceMonitorConfig
from serve.protocol import RequestError, openrlhf_response


def ledger(**cfg) -> CallerLedger:
    out = CallerLedger()
    out.configure(ServiceMonitorConfig(**cfg), None)
    return out


def test_a_later_step_closes_the_open_one_and_the_record_keeps_what_was_returned():
    book = ledger()
    book.add("run", 0, "p", ["a b", "a b c d"], [1.0, 2.0], [(4, 2)])
    book.add("run", 0, "q", ["x", "x y z"], [None, 3.0], failed_judgments=1)
    assert book.take_metrics() == [] and book.callers["run"].counts["steps_monitored"] == 0
    book.add("run", 1, "p", ["a", "b"], [2.0, 2.0])
    (caller, step, metrics), = book.take_metrics()
    assert (caller, step) == ("run", 0)
    # step 0: one group with a correlation (p: longer got more); q's null reward is left out, leaving one row
    assert metrics["monitor/length/reward_corr_spearman"] == pytest.approx(1.0)
    assert metrics["monitor/length/rollout_mean"] == pytest.approx((2 + 4 + 3) / 3)
    assert metrics["monitor/position/first_share"] == 1.0
    stats = book.stats()["run"]
    assert stats["record"] == [{"step": 0, "rewards": [1.0, 2.0]}, {"step": 0, "rewards": [None, 3.0]},
                               {"step": 1, "rewards": [2.0, 2.0]}]
    assert (stats["null_rewards"], stats["failed_judgments"], stats["rollouts"], stats["open_step"]) == (1, 1, 6, 1)


def test_a_caller_without_steps_gets_one_every_step_rollouts_grouped_by_prompt():
    book = ledger(step_rollouts=4)
    for text, reward in (("a", 1.0), ("a b c", 3.0), ("a", 1.0), ("a b c d e", 5.0)):  # one rollout per request
        book.add("orl", None, "same prompt", [text], [reward])
    (caller, step, metrics), = book.take_metrics()
    assert (caller, step) == ("orl", 0) and metrics["monitor/length/reward_corr_pearson"] == pytest.approx(1.0)
    book.add("orl", None, "next", ["z"], [1.0])
    assert book.stats()["orl"]["open_step"] == 1 and book.stats()["orl"]["steps_closed"] == 1


def test_a_straggler_of_an_earlier_step_is_counted_into_the_open_one():
    book = ledger()
    book.add("run", 3, "p", ["a"], [1.0])
    book.add("run", 2, "p", ["a b"], [2.0])
    assert book.stats()["run"]["late_groups"] == 1 and book.stats()["run"]["open_step"] == 3


def test_requests_without_a_caller_or_with_monitors_off_are_not_recorded():
    book = ledger()
    book.add(None, 0, "p", ["a"], [1.0])
    off = ledger(enabled=False)
    off.add("run", 0, "p", ["a"], [1.0])
    assert book.stats() == {} and off.stats() == {}


def test_the_least_recently_seen_caller_goes_past_max_callers():
    book = ledger(max_callers=2)
    for name in ("a", "b", "a", "c"):
        book.add(name, 0, "p", ["x"], [1.0])
    assert list(book.stats()) == ["a", "c"]


def test_the_service_refuses_a_probe_set_naming_the_key():
    with pytest.raises(ConfigError, match="monitor.probe_path"):
        check_tree(ServiceMonitorConfig(probe_path="probe.jsonl"), "monitor")


@pytest.mark.parametrize("query, prompt, expected", [
    ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there.<|im_end|>",
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "Hello there."),
    ("<s> [INST] Hi [/INST] Hello.</s>", "[INST] Hi [/INST]", " Hello."),  # a BOS the prompt text did not have
    ("Q: 2+2? A: 4<|endoftext|>\n", "Q: 2+2? A: ", "4"),
])
def test_openrlhf_response_is_what_follows_the_prompt_without_end_tokens(query, prompt, expected):
    assert openrlhf_response(query, prompt, "query[0]") == expected


def test_openrlhf_query_without_its_prompt_is_refused_naming_the_query():
    with pytest.raises(RequestError, match=r"query\[2\]"):
        openrlhf_response("something else entirely", "Q: hi", "query[2]")
