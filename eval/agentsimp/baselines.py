"""Table 2's single-prompt LLM baselines of paper 004 (Appendix B): one call per document and prompting template.

"To mitigate the variability of prompting LLMs directly, we employed three prompting templates, averaging their
outputs from Template 1, Template 2, and Template 3" (Figs. 6-8, `configs/prompts/agentsimp_baseline_template_*`).
Each baseline is a system of its own beside the four AgentSimp configurations, on the same backbone, sampling,
retries and guards (a cut answer falls back to the document, counted): `llm_t1`, `llm_t2`, `llm_t3`, and
`llm_mean`, the per-document mean of their scores (the paper's averaged row; built in
`eval.agentsimp.records.score_rows`). The raw text a template gets is the document as the planners see it (headings
as "#" lines). Template 3 needs "a pair of complete complex-simple documents", which the paper does not print:
`render_example` lays out the pair the job is given.

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from core.errors import CorpusError
from core.files import json_object, read_utf8
from eval.agentsimp.outputs import RoleOutcome
from eval.agentsimp.parse import RoleValue
from eval.agentsimp.plan import RoleCall
from eval.agentsimp.run import call_record

# baseline system -> (role id, row label)
BASELINES = {"llm_t1": ("baseline_template_1", "LLM T1"), "llm_t2": ("baseline_template_2", "LLM T2"),
             "llm_t3": ("baseline_template_3", "LLM T3")}
MEAN, MEAN_LABEL = "llm_mean", "LLM (T1-T3 mean)"
STAGE = "llm"
LABELS = {**{name: label for name, (_, label) in BASELINES.items()}, MEAN: MEAN_LABEL}


def render_example(complex_doc: str, simple_doc: str) -> str:
    """Template 3's in-context pair as the prompt shows it.

    >>> render_example("Hard words.", "Easy words.")
    'Complex document:\\nHard words.\\n\\nSimple document:\\nEasy words.'
    """
    return f"Complex document:\n{complex_doc.strip()}\n\nSimple document:\n{simple_doc.strip()}"


def read_example(path) -> str:
    """Template 3's pair from a JSON file {"complex": str, "simple": str}, rendered (`render_example`).

    Raises:
        CorpusError: missing file, bad JSON, other keys, or an empty text (naming the file).
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    record = json_object(read_utf8(path, CorpusError), str(path), CorpusError)
    if set(record) != {"complex", "simple"}:
        raise CorpusError(f"{path}: expected exactly the keys 'complex' and 'simple', got {sorted(record)}")
    for key in ("complex", "simple"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise CorpusError(f"{path}: {key!r} must be a non-empty string")
    return render_example(record["complex"], record["simple"])


def baseline_call(name: str, document: str, example: str = "") -> RoleCall:
    """The one call of baseline `name` on `document`; its fallback is the document itself (nothing simplified)."""
    role = BASELINES[name][0]
    if name == "llm_t3" and not example.strip():
        raise ValueError("llm_t3 (prompting template 3) needs an in-context example pair")
    inputs = ((("example", example),) if name == "llm_t3" else ()) + (("raw_text", document),)
    return RoleCall(role, inputs, RoleValue(document))


def baseline_record(name: str, call: RoleCall, outcome: RoleOutcome) -> dict:
    """A baseline's run as the record shape of `eval.agentsimp.run.run_record` (one stage, `STAGE`)."""
    text = outcome.value.text_or(call.fallback.text or "")
    return {"config": name, "label": LABELS[name], "settings": {"template": BASELINES[name][0]}, "guideline": None,
            "outline": None, "stages": {STAGE: text}, "final": text, "paragraphs": [], "windows": [],
            "calls": [call_record(call, outcome)]}


def baseline_records(document: str, names, outcomes: Mapping[str, RoleOutcome], example: str = "") -> dict:
    """name -> record of every baseline in `names`, from the settled outcomes (key -> outcome) of their calls."""
    out = {}
    for name in names:
        call = baseline_call(name, document, example)
        out[name] = baseline_record(name, call, outcomes[call.key])
    return out
