"""Degenerate-revision guard for CRAFT (paper 002): empty, refusal, truncated, collapsed or bloated revisions.

Why: the TG-MCTS reward ``R = R_g + R_c`` can be gamed by dropping content. The authors' released CRAFT-4o
predictions contain refusals ("There appears to be a misunderstanding. Could you please provide the text...") and
two-sentence outputs for long inputs that still pass a per-sentence-length constraint with a good perplexity
(notes 002 §6.8). The paper has no guard; ours is a documented deviation.

One rule for every system, so no system "wins" by being judged more kindly: a revision the guard flags is replaced
by the text it revised and counted by reason. Direct falls back to the input, an Iter round or an agent step to the
previous text (``eval.craft.agent``), and a TG-MCTS child is never expanded or chosen and gets a floor reward
(``eval.craft.mcts``), so the search answers with a usable node or the input. The CRAFT job refuses an
``agent.guard`` (Direct, Iter, agent) that differs from ``mcts.guard``.

Checks, in this order (the first that fires is the reason):

=============  =========================================================================================
``empty``      nothing but whitespace
``refusal``    ``refusal_regex`` matches within the first ``refusal_window`` characters, and does NOT
               match the start of the original text (a short story may itself open with "I'm sorry,")
``truncated``  the generation hit its token limit (the caller's flag, ``finish_reason == "length"``);
               with ``truncation: flag_or_unterminated`` (the default) also a text that stops without
               final punctuation when the original ends with it: a text cut mid-sentence, whatever the
               finish reason says (a spliced or joined revision has no finish reason of its own)
``collapsed``  fewer than ``min_len_ratio`` x the reference text's words
``bloated``    ``max_len_ratio`` x the reference text's words or more (a duplicated input, exactly
               2.0x, is bloated)
=============  =========================================================================================

Words are whitespace-separated tokens: the guard needs a robust size measure, not the constraint tools' counter
(``eval.craft.tools``), so it does not depend on it. The reference text is the parent node's text
(``length_reference: parent``, catches one-step collapse) or the original (``original``, also catches a slow
shrink over many levels).

This module is pure (no ray, vllm, deepspeed, torch or transformers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from core.config import Section, dotted, fail, one_of

# Openers of assistant refusals and clarification requests (English). Searched only at the start of a revision:
# a refusal replaces the answer, it does not sit in the middle of a revised paragraph.
DEFAULT_REFUSAL_REGEX = (
    r"(?i)\b(?:i[’']?m sorry|i am sorry|i apologi[sz]e|i can[’']?not|i can[’']?t (?:help|assist|comply|do)"
    r"|i[’']?m (?:unable|not able)|i am (?:unable|not able)|as an ai\b|could you (?:please )?provide"
    r"|please provide the text|there (?:appears|seems) to be (?:a|some) misunderstanding)"
)
# what may end a complete English paragraph: sentence punctuation, optionally followed by closing quotes/brackets
_TERMINATED_RE = re.compile(r"[.!?…:;][\"'’”)\]]*\s*$")

GUARD_REASONS = ("empty", "refusal", "truncated", "collapsed", "bloated")
TRUNCATION_MODES = ("off", "flag", "flag_or_unterminated")
LENGTH_REFERENCES = ("parent", "original")


@dataclass(frozen=True)
class GuardConfig(Section):
    """Knobs of the degenerate-revision guard (none of them is in the paper; defaults are ours).

    Attributes:
        enabled: Off = no revision is ever flagged (the paper's behaviour).
        min_len_ratio: A revision with fewer words than this x the reference text's is ``collapsed``. CORD's
            length constraints never ask for less than about the source's length (notes 002 §4.1), so 0.5 only
            catches content loss. 0 = off.
        max_len_ratio: This x the reference's words or more is ``bloated`` (rambling, repeated text: the input
            written twice is exactly 2x). 0 = off.
        length_reference: ``parent`` (the text the planner revised) or ``original`` (the CORD input).
        refusal_regex: Python regex for refusals; "" = off.
        refusal_window: Characters at the start of the revision the regex is searched in.
        truncation: ``off``; ``flag`` (the caller's truncated flag only); ``flag_or_unterminated`` (the default:
            also a revision without final punctuation when the original has it, i.e. cut mid-sentence).
    """

    enabled: bool = True  # flag degenerate revisions; false = none is ever flagged (the paper's behaviour)
    # a revision with fewer words than this x the reference text's is `collapsed` (0.5 only catches content loss); 0 =
    # off
    min_len_ratio: float = 0.5
    # a revision with this x the reference's words or more is `bloated` (rambling, repeated text: the input written
    # twice is exactly 2x); 0 = off
    max_len_ratio: float = 2.0
    # the text the length ratios compare with: `parent` (the text the planner revised) or `original` (the CORD input)
    length_reference: Literal["parent", "original"] = "parent"
    refusal_regex: str = DEFAULT_REFUSAL_REGEX  # Python regex for refusals; "" = off
    refusal_window: int = 300  # characters at the start of the revision the regex is searched in
    # `off`; `flag` (the caller's truncated flag only); `flag_or_unterminated` (also a revision without final
    # punctuation when the original has it: cut mid-sentence)
    truncation: Literal["off", "flag", "flag_or_unterminated"] = "flag_or_unterminated"

    def __post_init__(self) -> None:
        self.validate()  # checked like a section loaded from YAML (`core.config.Section`)

    def check(self, where: str = "") -> None:
        # min_len_ratio, max_len_ratio >= 0: check_tree's floor
        if self.max_len_ratio and self.max_len_ratio < self.min_len_ratio:
            fail(dotted(where, "max_len_ratio"), f"{self.max_len_ratio} is below min_len_ratio {self.min_len_ratio}")
        one_of(self.length_reference, LENGTH_REFERENCES, dotted(where, "length_reference"))
        one_of(self.truncation, TRUNCATION_MODES, dotted(where, "truncation"))
        if self.refusal_window < 1:
            fail(dotted(where, "refusal_window"), f"must be >= 1, got {self.refusal_window}")
        try:
            re.compile(self.refusal_regex)
        except re.error as exc:
            fail(dotted(where, "refusal_regex"), f"not a valid regex: {exc}")


def word_count(text: str) -> int:
    """Whitespace tokens (the guard's size measure).

    >>> word_count("  A b-c,  d. ")
    3
    """
    return len(text.split())


def is_refusal(text: str, original: str, config: GuardConfig) -> bool:
    """True if ``text`` opens like a refusal and ``original`` does not.

    >>> cfg = GuardConfig()
    >>> is_refusal("I'm sorry, but I can't help with that.", "The cat sat.", cfg)
    True
    >>> is_refusal("I'm sorry, she said, and left.", "I'm sorry, she said and left.", cfg)
    False
    """
    if not config.refusal_regex:
        return False
    pattern = re.compile(config.refusal_regex)
    window = config.refusal_window
    return bool(pattern.search(text[:window])) and not pattern.search(original[:window])


def degenerate_reason(
    text: str, parent_text: str, original: str, config: GuardConfig, *, truncated: bool = False
) -> str:
    """Why ``text`` is a degenerate revision, or ``""`` if it is usable.

    Args:
        text: The revision to check.
        parent_text: The text it revises (the parent node's text; the original at the root).
        original: The task's input text.
        config: Guard knobs.
        truncated: The generation that produced ``text`` stopped at its token limit.

    Returns:
        One of :data:`GUARD_REASONS`, or ``""``.

    >>> cfg = GuardConfig()
    >>> parent = "one two three four five six seven eight nine ten."
    >>> degenerate_reason("one two three four five six seven eight nine.", parent, parent, cfg)
    ''
    >>> degenerate_reason("one.", parent, parent, cfg)
    'collapsed'
    >>> degenerate_reason("one two three four five six seven eight nine.", parent, parent, cfg, truncated=True)
    'truncated'
    """
    if not config.enabled:
        return ""
    if not text.strip():
        return "empty"
    if is_refusal(text, original, config):
        return "refusal"
    if config.truncation != "off" and truncated:
        return "truncated"
    if (
        config.truncation == "flag_or_unterminated"
        and _TERMINATED_RE.search(original)
        and not _TERMINATED_RE.search(text)
    ):
        return "truncated"
    reference = word_count(parent_text if config.length_reference == "parent" else original)
    words = word_count(text)
    if reference and config.min_len_ratio and words < config.min_len_ratio * reference:
        return "collapsed"
    if reference and config.max_len_ratio and words >= config.max_len_ratio * reference:
        return "bloated"
    return ""
