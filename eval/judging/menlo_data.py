"""MENLO-format pairs (paper 003), rubrics and judge-protocol items: read, validate, render. Pure (no ray).

A MENLO-format file is JSON Lines, one response pair per line:

==================  ========  ================================================================================
field               required  meaning
==================  ========  ================================================================================
``pair_id``         yes       unique id of the pair (string)
``dimension``       yes       ``fluency`` | ``tone`` | ``localized_tone`` | ``localized_factuality``
``locale``          yes       language variety, e.g. ``de_DE``, ``hi_Latn_IN``
``prompt``          yes       the localized user prompt
``response_a/_b``   yes       the two responses
``gold_a/_b``       yes       gold grades in [1, 5]; a non-integer (an averaged rating, paper Errata E1) is
                              rounded half up to a class for F1 / accuracy / alpha, and used as is for the
                              preference sign(gold_a - gold_b)
``template_id``     no        template group (the paper's split unit); default ``pair_id``. Few-shot exemplars
                              never come from the judged pair's group
``question_type``   no        rubric question type (kept with every judge call; one rubric per dimension here)
``split``           no        ``train`` | ``val`` | ``test`` (default ``test``)
``prompt_en``       no        the English template the prompt was localized from (kept, not shown)
==================  ========  ================================================================================

Protocols (paper 003 §3): ``pointwise`` (one response per call -> one grade), pointwise with three graded
exemplars (``fewshot: true``: one graded 1-2, one 3, one 4-5, same dimension), and ``pairwise`` (both responses in
one call -> two grades; preference derived, never asked), each with the dimension's rubric or only the five labels.
Few-shot pairwise (run in the paper for Qwen3-4B only, exemplar choice unstated) shows three graded pairs of the
same dimension: one where A is graded higher, one tie, one where B is: both positions and a tie, so the examples
themselves carry no position preference.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from core.config import Section, dotted, fail
from core.files import json_object, load_yaml, read_utf8
from core.text import is_blank
from eval.judging.menlo_parse import MENLO_LABELS
from eval.prompts import TemplateName, load_template, prompt_path

DIMENSIONS = ("fluency", "tone", "localized_tone", "localized_factuality")
REQUIRED = ("pair_id", "dimension", "locale", "prompt", "response_a", "response_b", "gold_a", "gold_b")
OPTIONAL = {"template_id": "", "question_type": "", "split": "test", "prompt_en": ""}
SPLITS = ("train", "val", "test")
DEFAULT_TEMPLATES = {("pointwise", False): "menlo_pointwise", ("pointwise", True): "menlo_pointwise_fewshot",
                     ("pairwise", False): "menlo_pairwise", ("pairwise", True): "menlo_pairwise_fewshot"}
# paper 003 §3: "one graded 1-2, one graded 3 and one graded 4-5"
EXEMPLAR_BUCKETS = ((1, 2), (3,), (4, 5))
# few-shot pairwise (ours, see the module docstring): sign of gold class A - gold class B
PAIR_BUCKETS = (("A higher", 1), ("tie", 0), ("B higher", -1))


class MenloDataError(ValueError):
    """Bad MENLO-format input; the message names the file, line and field."""


@dataclass
class Protocol(Section):
    """One judging protocol of the evaluation (a config section of jobs/judge/evaluate.py)."""

    # label in tables and reports, e.g. "pairwise+rubric"; unique
    name: str = "pairwise+rubric"
    # pointwise (each response graded alone) | pairwise (both responses of a pair in one prompt)
    mode: Literal["pointwise", "pairwise"] = "pairwise"
    # the dimension's rubric (true) or only the five labels (false)
    rubric: bool = True
    # three graded exemplars of the same dimension (pairwise: three graded pairs: A higher, tie, B higher)
    fewshot: bool = False
    # pairwise only: judge (A, B) and (B, A) (needed for the position-bias rate); false = one seeded random order
    both_orders: bool = True
    # prompt template; "" = menlo_pointwise / menlo_pointwise_fewshot / menlo_pairwise / menlo_pairwise_fewshot
    template: TemplateName = ""

    def template_name(self) -> str:
        return self.template or DEFAULT_TEMPLATES[(self.mode, self.fewshot)]

    def check(self, where: str = "") -> None:
        needed = {"pointwise": {"response"}, "pairwise": {"response_a", "response_b"}}[self.mode]
        if self.fewshot:
            needed.add("examples")
        variables = set(load_template(prompt_path(self.template_name())).variables)
        missing = sorted(needed - variables)
        if missing:
            fail(dotted(where, "template"), f"{self.template_name()!r} has no {missing[0]!r} variable for a {self.mode} "
                                         "protocol")


# ---------------------------------------------------------------------------------------------------------------
# Reading


def read_menlo_jsonl(path: str | Path) -> pd.DataFrame:
    """Read and validate a MENLO-format JSONL file (fields in the module docstring).

    Raises:
        MenloDataError: naming file, line and field: not JSON, a missing/empty field, an unknown dimension or
            split, a grade outside [1, 5], a duplicated pair_id, or no rows at all.
    """
    path = Path(path)
    rows, seen = [], {}
    for lineno, line in enumerate(read_utf8(path, MenloDataError).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        row = _check_record(json_object(line, where, MenloDataError), where)
        if row["pair_id"] in seen:
            raise MenloDataError(f"{where}, field 'pair_id': {row['pair_id']!r} already used on line "
                                 f"{seen[row['pair_id']]}")
        seen[row["pair_id"]] = lineno
        rows.append(row)
    if not rows:
        raise MenloDataError(f"{path}: no pairs")
    return pd.DataFrame(rows)


def _check_record(record: dict, where: str) -> dict:
    for key in REQUIRED:
        if key not in record:
            raise MenloDataError(f"{where}: missing field {key!r}")
    row = {key: record[key] for key in REQUIRED}
    for key in ("pair_id", "locale", "prompt", "response_a", "response_b"):
        if not isinstance(row[key], str) or is_blank(row[key]):
            raise MenloDataError(f"{where}, field {key!r}: must be a non-empty string")
    if row["dimension"] not in DIMENSIONS:
        raise MenloDataError(f"{where}, field 'dimension': {row['dimension']!r} is not one of {list(DIMENSIONS)}")
    for key in ("gold_a", "gold_b"):
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 5:
            raise MenloDataError(f"{where}, field {key!r}: grade must be a number in [1, 5], got {value!r}")
        row[key] = float(value)
    for key, default in OPTIONAL.items():
        value = record.get(key, default)
        if not isinstance(value, str):
            raise MenloDataError(f"{where}, field {key!r}: must be a string")
        row[key] = value
    row["template_id"] = row["template_id"] or row["pair_id"]
    if row["split"] not in SPLITS:
        raise MenloDataError(f"{where}, field 'split': {row['split']!r} is not one of {list(SPLITS)}")
    return row


def gold_class(grade: float) -> int:
    """A gold grade as a 1-5 class: round half up (3.5 -> 4; Python's round() would give 4 but 2.5 -> 2).

    >>> [gold_class(g) for g in (1.0, 2.5, 3.49, 4.5)]
    [1, 3, 3, 5]
    """
    return math.floor(grade + 0.5)


def load_rubrics(path: str | Path) -> dict:
    """Read ``configs/data/menlo_rubrics.yaml``: every dimension with name, definition, question, criteria 1-5.

    Raises:
        MenloDataError: naming the file and the missing or malformed key.
    """
    path = Path(path)
    data = load_yaml(read_utf8(path, MenloDataError), str(path), MenloDataError)
    if not isinstance(data, dict):
        raise MenloDataError(f"{path}: top level must be a mapping of dimensions")
    for dim in DIMENSIONS:
        entry = data.get(dim)
        if not isinstance(entry, dict):
            raise MenloDataError(f"{path}: missing dimension {dim!r}")
        for key in ("name", "definition", "question"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise MenloDataError(f"{path}: {dim}.{key} must be a non-empty string")
        criteria = entry.get("criteria")
        if not isinstance(criteria, dict) or sorted(criteria) != [1, 2, 3, 4, 5]:
            raise MenloDataError(f"{path}: {dim}.criteria must have the keys 1, 2, 3, 4, 5")
        for grade, bullets in criteria.items():
            if not isinstance(bullets, list) or not bullets or not all(isinstance(b, str) for b in bullets):
                raise MenloDataError(f"{path}: {dim}.criteria.{grade} must be a non-empty list of strings")
    return data


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def render_criteria(rubric: dict, with_rubric: bool) -> str:
    """The ``{criteria}`` block: definition + graded bullets, or only the five labels (paper Figs. 5-8 format).

    >>> print(render_criteria({"definition": "d", "criteria": {}}, False))
    ### Grading Criteria:
    1 - MAJOR FAILURE
    2 - MINOR FAILURE
    3 - PASS
    4 - GOOD
    5 - EXCELLENT
    """
    lines = ["### Grading Criteria:"]
    for grade, label in MENLO_LABELS.items():
        lines.append(f"{grade} - {label}")
        if with_rubric:
            lines += [f"* {bullet}" for bullet in rubric["criteria"][grade]]
    block = "\n".join(lines)
    return f"Definition: {rubric['definition']}\n\n{block}" if with_rubric else block


def grade_line(grade: int) -> str:
    """``<final_grade> FINAL GRADE: k - LABEL </final_grade>`` for an exemplar."""
    return f"<final_grade> FINAL GRADE: {grade} - {MENLO_LABELS[grade]} </final_grade>"


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}|{key}".encode()).hexdigest()


def exemplar_pool(pairs: pd.DataFrame) -> pd.DataFrame:
    """One row per graded response of the exemplar pairs: dimension, template_id, prompt, response, grade, key."""
    parts = []
    for side in ("a", "b"):
        parts.append(pd.DataFrame({
            "dimension": pairs["dimension"], "template_id": pairs["template_id"], "prompt": pairs["prompt"],
            "response": pairs[f"response_{side}"], "grade": pairs[f"gold_{side}"].map(gold_class),
            "key": pairs["pair_id"] + f"|{side}"}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def pick_exemplars(pool: pd.DataFrame, dimension: str, exclude_template: str, seed: int) -> list[dict]:
    """Three exemplars of `dimension`, one per bucket (1-2, 3, 4-5), none from the template group `exclude_template`.

    Within a bucket the pick is the lowest sha256(seed|key): deterministic, and a different seed picks others.

    Raises:
        MenloDataError: a bucket has no eligible exemplar (the message names dimension and grades).
    """
    eligible = pool[(pool["dimension"] == dimension) & (pool["template_id"] != exclude_template)]
    picked = []
    for bucket in EXEMPLAR_BUCKETS:
        candidates = eligible[eligible["grade"].isin(bucket)]
        if candidates.empty:
            raise MenloDataError(f"fewshot: no exemplar graded {'-'.join(map(str, bucket))} for dimension "
                                 f"{dimension!r} outside template group {exclude_template!r}")
        best = min(candidates.to_dict("records"), key=lambda r: _rank(seed, r["key"]))
        picked.append(best)
    return picked


def pick_pair_exemplars(pool: pd.DataFrame, dimension: str, exclude_template: str, seed: int) -> list[dict]:
    """Three graded pairs of `dimension` (A higher, tie, B higher; PAIR_BUCKETS), none from `exclude_template`.

    `pool` is `exemplar_pool`'s (one row per graded response); a pair is its two rows. Within a bucket the pick is
    the lowest sha256(seed|pair_id), as in `pick_exemplars`.

    Raises:
        MenloDataError: a bucket has no eligible pair (the message names dimension and bucket).
    """
    eligible = pool[(pool["dimension"] == dimension) & (pool["template_id"] != exclude_template)]
    sides = eligible.assign(pair_id=eligible["key"].str.rsplit("|", n=1).str[0],
                            side=eligible["key"].str.rsplit("|", n=1).str[1])
    wide = sides.pivot(index="pair_id", columns="side", values=["response", "grade"]).dropna()
    prompts = sides.drop_duplicates("pair_id").set_index("pair_id")["prompt"]
    picked = []
    for name, sign in PAIR_BUCKETS:
        diff = wide[("grade", "a")].astype(int) - wide[("grade", "b")].astype(int)
        ids = [pid for pid, d in diff.items() if (d > 0) - (d < 0) == sign]
        if not ids:
            raise MenloDataError(f"fewshot: no exemplar pair with {name} for dimension {dimension!r} outside "
                                 f"template group {exclude_template!r}")
        pid = min(ids, key=lambda i: _rank(seed, i))
        picked.append({"prompt": prompts[pid], "response_a": wide.loc[pid, ("response", "a")],
                       "response_b": wide.loc[pid, ("response", "b")], "grade_a": int(wide.loc[pid, ("grade", "a")]),
                       "grade_b": int(wide.loc[pid, ("grade", "b")])})
    return picked


def render_pair_examples(exemplars: list[dict]) -> str:
    blocks = []
    for i, ex in enumerate(exemplars, start=1):
        grades = "\n".join(grade_line(ex[f"grade_{s}"]).replace("final_grade", f"final_grade_{s.upper()}")
                           for s in ("a", "b"))
        blocks.append(f"[Example {i}]\n[User Prompt]\n{ex['prompt']}\n\n[Response A]\n{ex['response_a']}\n\n"
                      f"[Response B]\n{ex['response_b']}\n\n{grades}")
    return "\n\n".join(blocks)


def render_examples(exemplars: list[dict]) -> str:
    blocks = []
    for i, ex in enumerate(exemplars, start=1):
        blocks.append(f"[Example {i}]\n[User Prompt]\n{ex['prompt']}\n\n[Response]\n{ex['response']}\n\n"
                      f"{grade_line(int(ex['grade']))}")
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------------------------
# Items: one judge call each


def shown_order(protocol: Protocol, pair_id: str, seed: int) -> list[str]:
    """Presentation orders of a pair: both, or one picked from (seed, protocol, pair) (paper: randomized)."""
    if protocol.both_orders:
        return ["AB", "BA"]
    return ["AB"] if int(_rank(seed, f"{protocol.name}|{pair_id}"), 16) % 2 == 0 else ["BA"]


def build_items(pairs: pd.DataFrame, pool: pd.DataFrame, protocols: list[Protocol], rubrics: dict,
                seed: int) -> pd.DataFrame:
    """Every judge call of every protocol with its rendered messages (JSON), sorted so a batch shares a prompt prefix.

    Columns: item_id, protocol, mode, pair_id, template_id, dimension, locale, question_type, unit (pointwise: the
    judged response "a"/"b"; pairwise: the shown order "AB"/"BA"), gold_a, gold_b (the pair's, original
    identity), messages_json.
    """
    rows = []
    for protocol in protocols:
        template = load_template(prompt_path(protocol.template_name()))
        for pair in pairs.to_dict("records"):
            rubric = rubrics[pair["dimension"]]
            common = {"dimension": rubric["name"], "question": rubric["question"],
                      "criteria": render_criteria(rubric, protocol.rubric), "locale": pair["locale"],
                      "prompt": pair["prompt"]}
            if protocol.fewshot and protocol.mode == "pairwise":
                common["examples"] = render_pair_examples(pick_pair_exemplars(pool, pair["dimension"],
                                                                              pair["template_id"], seed))
            elif protocol.fewshot:
                common["examples"] = render_examples(pick_exemplars(pool, pair["dimension"], pair["template_id"],
                                                                    seed))
            for unit, values in _units(protocol, pair, seed):
                messages = template.render(**{**common, **values})
                rows.append({
                    "item_id": f"{protocol.name}|{pair['pair_id']}|{unit}", "protocol": protocol.name,
                    "mode": protocol.mode, **{k: pair[k] for k in ("pair_id", "template_id", "dimension", "locale",
                                                                   "question_type", "gold_a", "gold_b")},
                    "unit": unit, "messages_json": json.dumps(messages, ensure_ascii=False)})
    items = pd.DataFrame(rows)
    if items.empty:
        return items
    return items.sort_values(["protocol", "dimension", "pair_id", "unit"], ignore_index=True)


def _units(protocol: Protocol, pair: dict, seed: int) -> list[tuple[str, dict]]:
    if protocol.mode == "pointwise":
        return [(side, {"response": pair[f"response_{side}"]}) for side in ("a", "b")]
    units = []
    for order in shown_order(protocol, pair["pair_id"], seed):
        first, second = ("a", "b") if order == "AB" else ("b", "a")
        units.append((order, {"response_a": pair[f"response_{first}"], "response_b": pair[f"response_{second}"]}))
    return units


def to_original(unit: str, shown_a: int | None, shown_b: int | None) -> tuple[int | None, int | None]:
    """Grades in the pair's original identity (pred_a, pred_b) from what the judge gave the shown A / B.

    Pointwise units carry one grade (in `shown_a`) for the judged response.

    >>> to_original("BA", 2, 5), to_original("b", 4, None)
    ((5, 2), (None, 4))
    """
    if unit == "AB":
        return shown_a, shown_b
    if unit == "BA":
        return shown_b, shown_a
    if unit == "a":
        return shown_a, None
    if unit == "b":
        return None, shown_a
    raise ValueError(f"unknown unit {unit!r}")
