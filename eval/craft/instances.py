"""Constrained training instances for CRAFT's planner self-training (paper 002, §3 and Algorithm 1 line 2).

Each self-training round draws raw texts from D_r and "generate[s] constraints following the method in §3": the
paper revises each text with GPT-4o, extracts sentence- and word-level features *from that revision*, fills the
Table 14 program templates with M randomly chosen features, and renders the instruction with GPT-4o. Without a
GPT-4o on CPU we take the features from a ``reference`` text the caller passes (default: the text itself), so every
constraint is satisfiable by construction (the paper's guarantee, from its revision) and the instruction is the
unrendered template text ("Polish the following text." + one Table 14 sentence per constraint), which is CORD's
``instruction="template"`` form (docs/papers/002-craft.md, Deviations).

    rng = random.Random(0)
    instance = make_instance("d1", text, rng, n_constraints=2)
    instance.instruction, instance.gold_calls                 # what the planner reads / the predefined tool usage

Numbers: counts come from ``eval.craft.text`` (the tools' own counting rules); a count bound leaves a margin of
``slack`` (fraction of the observed count, at least 1) and is rounded outward to a multiple of ``round_to``, so a
revision has room to change the text (CORD's thresholds are multiples of 20; a short demo text needs 1 or 5).

Pure module: no ray, torch or model.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import CorpusError
from core.files import json_object, read_utf8
from eval.craft.calls import canonical
from eval.craft.cord import Constraint
from eval.craft.text import REFERENCE, TextRules, keyword_count, sentence_lengths, split_sentences, word_count

BASE_INSTRUCTION = "Polish the following text."
# the Table 14 sub-groups the sampler draws from (all eight)
KINDS = ("keep_sentence", "modify_sentence", "word_count", "sentence_count", "per_sentence_length",
         "include_keyword", "remove_keyword", "keyword_frequency")
# keywords: alphabetic words of this length or more, so that a substring count (the tools' rule) means the word
_KEYWORD = re.compile(r"\b[A-Za-z]{5,}\b")


@dataclass(frozen=True)
class Instance:
    """One constrained revision task: the planner reads ``instruction`` and ``text``; ``gold_calls`` are the
    predefined tool usage (S_v's reference and S_c's checks)."""

    id: str
    text: str
    instruction: str
    constraints: list[Constraint] = field(default_factory=list)

    @property
    def gold_calls(self) -> list[str]:
        return [call for c in self.constraints for call in c.calls]

    @property
    def keep_ids(self) -> list[int]:
        """Sentences a keep-sentence constraint protects (the demo planner's plan leaves them unchanged)."""
        return sorted({i for c in self.constraints if c.type == "keep_sentence" for i in c.args["ids"]})


def _ordinal_ids(ids: list[int]) -> str:
    """Table 14's id list: "2-th", "2-th, and 4-th", "1-th, 2-th, and 5-th" (the paper's wording, "-th" for all)."""
    parts = [f"{i}-th" for i in ids]
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + ", and " + parts[-1]


def _up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def _down(value: float, step: int) -> int:
    return int(math.floor(value / step) * step)


def _constraint(kind: str, relation: str, args: dict, calls: list[str], prompt: str) -> Constraint:
    return Constraint(type=kind, relation=relation, args=args, call="; ".join(canonical(c) for c in calls),
                      prompt=prompt)


def _sentence_ids(rng: random.Random, n_sentences: int) -> list[int]:
    # at most 3 ids (Table 14) and never every sentence: keeping all of them leaves nothing to revise
    k = rng.randint(1, min(3, max(1, n_sentences - 1)))
    return sorted(rng.sample(range(1, n_sentences + 1), k))


def _count_bound(rng: random.Random, observed: int, slack: float, round_to: int, what: str, kind: str,
                 call: str, relations: tuple[str, ...]) -> Constraint | None:
    """A word or sentence count (or per-sentence length) constraint that ``observed`` satisfies with a margin."""
    margin = max(1, round(slack * observed))
    relation = rng.choice(relations)
    if relation == "less than":
        n = _up(observed + margin, round_to)
        return _constraint(kind, relation, {"count": n}, [f'{call}({n}, "less than")'],
                           f"Output contain less than {n} {what}.")
    if relation == "more than":
        n = _down(observed - margin, round_to)
        if n < 1:
            return None
        return _constraint(kind, relation, {"count": n}, [f'{call}({n}, "more than")'],
                           f"Output contain more than {n} {what}.")
    if relation == "equal":
        return _constraint(kind, relation, {"count": observed}, [f'{call}({observed}, "equal")'],
                           f"Output contain should contain exactly {observed} {what}.")  # (sic), Table 14
    low, high = _down(observed - margin, round_to), _up(observed + margin, round_to)
    if low < 1:
        return None
    return _constraint(kind, "range", {"min": low, "max": high},
                       [f'{call}({high}, "less than")', f'{call}({low}, "more than")'],
                       f"Output contain less than {high} words and more than {low} words.")


def sample_constraint(kind: str, text: str, rng: random.Random, *, reference: str | None = None,
                      slack: float = 0.1, round_to: int = 1, avoid: frozenset[str] = frozenset(),
                      rules: TextRules = REFERENCE) -> Constraint | None:
    """One Table 14 constraint of sub-group ``kind`` built from ``reference``'s features (None if it has none to
    build from, e.g. a keyword constraint on a text without a five-letter word outside ``avoid``)."""
    reference = text if reference is None else reference
    sentences = split_sentences(text, rules)
    if kind in ("keep_sentence", "modify_sentence"):
        if not sentences:
            return None
        ids = _sentence_ids(rng, len(sentences))
        relation, verb = ("unchange", "Do not change") if kind == "keep_sentence" else ("change", "Only change")
        return _constraint(kind, relation, {"ids": ids}, [f'sentence_modification_check({ids}, "{relation}")'],
                           f"{verb} the {_ordinal_ids(ids)} sentence.")
    if kind == "word_count":
        return _count_bound(rng, word_count(reference, rules), slack, round_to, "words", kind, "word_count_check",
                            ("less than", "more than", "range"))
    if kind == "sentence_count":
        # one sentence more or less is already a real edit: no rounding, margin 1
        return _count_bound(rng, len(split_sentences(reference, rules)), 0.0, 1, "sentences", kind,
                            "sentence_count_check", ("less than", "more than", "equal"))
    if kind == "per_sentence_length":
        lengths = sentence_lengths(reference, rules)
        if not lengths:
            return None
        relation = rng.choice(("less than", "more than"))
        margin = max(1, round(slack * max(lengths)))
        n = _up(max(lengths) + margin, round_to) if relation == "less than" else _down(min(lengths) - margin, round_to)
        if n < 1:
            return None
        return _constraint(kind, relation, {"count": n}, [f'sentence_length_check({n}, "{relation}")'],
                           f"Each sentence should contain {relation} {n} words.")
    # one candidate per word whatever its case (its first spelling): the tools count keywords case-insensitively
    first: dict[str, str] = {}
    for w in _KEYWORD.findall(reference):
        first.setdefault(w.lower(), w)
    words = sorted(w for low, w in first.items() if low not in avoid)
    if not words:
        return None
    word = rng.choice(words)
    if kind == "include_keyword":
        return _constraint(kind, "keep", {"keyword": word}, [f'keyword_keep_removal_check("{word}", "keep")'],
                           f"Do not change the word '{word}'.")
    if kind == "remove_keyword":
        return _constraint(kind, "remove", {"keyword": word}, [f'keyword_keep_removal_check("{word}", "remove")'],
                           f"Do not use the word '{word}'.")
    if kind == "keyword_frequency":
        count = keyword_count(reference, word, rules)
        relation = rng.choice(("equal", "more than", "less than"))
        if relation == "equal":
            return _constraint(kind, relation, {"keyword": word, "count": count},
                               [f'keyword_frequency_check("{word}", {count}, "equal")'],
                               f"The word '{word}' should appear {count} times.")
        if relation == "more than":  # "at least N" = "more than N - 1" for counts
            return _constraint(kind, relation, {"keyword": word, "count": count - 1},
                               [f'keyword_frequency_check("{word}", {count - 1}, "more than")'],
                               f"The word '{word}' should appear at least {count} times.")
        return _constraint(kind, relation, {"keyword": word, "count": count + 1},
                           [f'keyword_frequency_check("{word}", {count + 1}, "less than")'],
                           f"The word '{word}' should appear less than {count + 1} times.")
    raise ValueError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")


def sample_constraints(text: str, m: int, rng: random.Random, *, kinds: tuple[str, ...] = KINDS,
                       reference: str | None = None, slack: float = 0.1, round_to: int = 1,
                       rules: TextRules = REFERENCE) -> list[Constraint]:
    """M constraints of M distinct sub-groups (the paper picks "M features"; two constraints of one group could
    contradict each other, e.g. keep and change the same sentence, so we draw groups without replacement). Keep
    and modify sentence exclude each other for the same reason; keyword constraints use different words."""
    chosen: list[Constraint] = []
    used_words: set[str] = set()
    pool = list(kinds)
    rng.shuffle(pool)
    for kind in pool:
        if len(chosen) == m:
            break
        if {kind, *(c.type for c in chosen)} >= {"keep_sentence", "modify_sentence"}:
            continue
        constraint = sample_constraint(kind, text, rng, reference=reference, slack=slack, round_to=round_to,
                                       avoid=frozenset(used_words), rules=rules)
        if constraint is None:
            continue
        chosen.append(constraint)
        if "keyword" in constraint.args:
            used_words.add(str(constraint.args["keyword"]).lower())
    return chosen


def make_instance(instance_id: str, text: str, rng: random.Random, n_constraints: int, *,
                  kinds: tuple[str, ...] = KINDS, reference: str | None = None, slack: float = 0.1,
                  round_to: int = 1, rules: TextRules = REFERENCE) -> Instance:
    """An instance with up to ``n_constraints`` constraints (fewer when the text offers fewer features)."""
    constraints = sample_constraints(text, n_constraints, rng, kinds=kinds, reference=reference, slack=slack,
                                     round_to=round_to, rules=rules)
    return Instance(instance_id, text, instruction_text(constraints), constraints)


def instruction_text(constraints: list[Constraint], base: str = BASE_INSTRUCTION) -> str:
    """The template instruction: the base request, then each constraint's Table 14 sentence."""
    return " ".join([base, *(c.prompt for c in constraints)])


@dataclass(frozen=True)
class RawText:
    """One raw text of D_r and where it came from (``file`` or ``file:line``)."""

    id: str
    text: str
    source: str


def read_raw_texts(path: str | Path, min_words: int = 350, max_words: int = 1000) -> tuple[list[RawText], dict]:
    """Plain raw texts for self-training (the paper's D_r: CNN/DailyMail texts of 350-1,000 words, §5.1.1).

    ``path`` is a ``.txt`` file (one text), a ``.jsonl`` file (one object per line with ``text``, or ``article``
    as in CNN/DailyMail dumps; ``id`` kept when present) or a directory of such files (sorted, recursively).
    Words are whitespace tokens; a text outside ``[min_words, max_words]`` (0 = no bound) is skipped and counted,
    never silently dropped. Returns the texts and the counts ``{"read", "kept", "too_short", "too_long",
    "empty"}``. A line that is not a JSON object with a text raises :class:`~core.errors.CorpusError` naming the
    file and line.
    """
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    elif root.is_file():
        files = [root]
    else:
        raise CorpusError(f"{root}: no such file or directory")
    if not files:
        raise CorpusError(f"{root}: no .txt or .jsonl files")
    texts: list[RawText] = []
    counts = {"read": 0, "kept": 0, "too_short": 0, "too_long": 0, "empty": 0}
    for file in files:
        for item in _raw_items(file):
            counts["read"] += 1
            n = len(item.text.split())
            reason = "empty" if n == 0 else "too_short" if min_words and n < min_words else \
                "too_long" if max_words and n > max_words else ""
            if reason:
                counts[reason] += 1
            else:
                counts["kept"] += 1
                texts.append(item)
    return texts, counts


def _raw_items(file: Path) -> list[RawText]:
    content = read_utf8(file, CorpusError).removeprefix("\ufeff")
    if file.suffix == ".txt":
        return [RawText(file.stem, content.strip(), file.name)]
    items = []
    for number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        record = json_object(line, f"{file}: line {number}", CorpusError)
        text = record.get("text", record.get("article"))
        if not isinstance(text, str):
            raise CorpusError(f"{file}: line {number}: no 'text' (or 'article') string")
        items.append(RawText(str(record.get("id", f"{file.stem}:{number}")), text.strip(), f"{file.name}:{number}"))
    return items


def first_sentences(text: str, n: int, rules: TextRules = REFERENCE) -> str:
    """The first ``n`` sentences of ``text`` joined by spaces (0 = all): short demo texts for a CPU model.

    Sentence splitting strips the final punctuation (the tools' rule), so it is taken from the text itself."""
    if n <= 0:
        return text.strip()
    pieces = re.split(r"(?<=[.!?])\s+", text.strip())
    return " ".join(pieces[:n])


def contradictions(instance: Instance, rules: TextRules = REFERENCE) -> list[str]:
    """Why no revision can meet every constraint of ``instance`` ([] when none is found).

    The sampler builds each constraint so that the reference text meets it, but two of them can still exclude each
    other through the tools' substring rules: a removed keyword that a kept sentence contains (the sentence must
    stay verbatim, the keyword must vanish), or a removed keyword inside a keyword that must stay or occur (removing
    "Smith" removes every "Smithson"). Such instances are counted (stage summaries), not dropped.

    >>> from eval.craft.cord import Constraint
    >>> keep = Constraint("keep_sentence", "unchange", {"ids": [1]}, "", "")
    >>> drop = Constraint("remove_keyword", "remove", {"keyword": "Smith"}, "", "")
    >>> contradictions(Instance("x", "Smith came. He left.", "", [keep, drop]))
    ["kept sentence 1 contains the removed keyword 'Smith'"]
    """
    sentences = split_sentences(instance.text, rules)
    removed = [str(c.args["keyword"]) for c in instance.constraints if c.type == "remove_keyword"]
    out = []
    for word in removed:
        for c in instance.constraints:
            if c.type == "keep_sentence":
                out += [f"kept sentence {i} contains the removed keyword {word!r}" for i in c.args["ids"]
                        if i <= len(sentences) and word in sentences[i - 1]]
            needed = c.type == "include_keyword" and keyword_count(instance.text, str(c.args["keyword"]), rules) > 0
            needed |= c.type == "keyword_frequency" and (c.relation == "more than" and c.args["count"] >= 0
                                                         or c.relation == "equal" and c.args["count"] > 0)
            if needed and word.lower() in str(c.args["keyword"]).lower() and \
                    (word in str(c.args["keyword"]) or rules.remove_ignore_case):
                out.append(f"removed keyword {word!r} is part of the keyword {c.args['keyword']!r} that must occur")
    return out


def constraint_mix(instances: list[Instance]) -> dict[str, int]:
    """How many constraints of each sub-group the instances hold (logged with the stage)."""
    return dict(Counter(c.type for i in instances for c in i.constraints))
