"""CRAFT's model-based text-quality scorer (paper 002, App. D.3): perplexity and BARTScore behind R_g and S_r.

``build_quality(config)`` returns the :data:`eval.craft.quality.QualityFn` that ``eval.craft.agent.Systems`` (the
agent's step reward and ``text_eval()``), TG-MCTS's R_g and Eq. 1's S_r call: ``score(original, revisions)``. With
``metric: d3`` it is :class:`QualityScorer`, which holds the models; with ``metric: difflib`` the old pure proxy.

- **Perplexity** (fluency): a causal LM (paper: GPT-2 Large). The text is cut into pieces (``ppl_split``: the
  authors' code splits on ``". "``), each piece scored with the model's BOS token in front when it has one (so
  every token of the piece is predicted), cut at ``max_length`` tokens; the token NLLs are pooled:
  ``exp(sum NLL / tokens)``.
- **BARTScore** (coherence): ``seq2seq`` = neulab's BARTScorer, the mean token log-likelihood of the revision
  given the input under an encoder-decoder (paper's code: ``facebook/bart-large-cnn``); ``causal`` = the CPU
  stand-in, the mean log-likelihood of the revision's tokens after ``input + "\\n\\n"`` under a causal LM.
- **SOME**: not built (``QualityConfig`` refuses ``some_model``).

The input's own scores (D.3's anchors PPL(init) and BARTScore(init, init)) are computed once per input and cached,
as are the scores of a text already seen (a search re-proposes texts). One text at a time: no padding to get wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

from actors.models import resolve_model_dir
from eval.craft.quality import (
    Anchors,
    QualityConfig,
    QualityFn,
    QualityScore,
    d3_quality,
    difflib_scorer,
    pooled_ppl,
    ppl_pieces,
)

BART_SEPARATOR = "\n\n"  # between the input and the revision in the causal stand-in


def build_quality(config: QualityConfig | dict) -> QualityFn:
    """The scorer ``config`` names: :class:`QualityScorer` (``d3``) or the difflib proxy."""
    cfg = config if isinstance(config, QualityConfig) else QualityConfig(**config)
    return difflib_scorer if cfg.metric == "difflib" else QualityScorer(cfg)


class QualityScorer:
    """Callable ``(original, revisions) -> [QualityScore]`` with D.3's R_g; models load on first use."""

    def __init__(self, config: QualityConfig):
        self.config = config
        self._models: dict[str, tuple] = {}
        self._anchors: dict[str, Anchors] = {}
        self._ppl: dict[str, float] = {}
        self._bart: dict[tuple[str, str], float] = {}

    # -- models ------------------------------------------------------------------------------------------------
    def _device(self) -> str:
        import torch

        if self.config.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.config.device

    def _load(self, spec: str, kind: str):
        key = f"{kind}:{spec}"
        if key not in self._models:
            import torch
            from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

            path = resolve_model_dir(spec)
            cls = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForCausalLM
            model = cls.from_pretrained(path, torch_dtype=getattr(torch, self.config.dtype)).to(self._device()).eval()
            self._models[key] = (AutoTokenizer.from_pretrained(path), model)
        return self._models[key]

    def _causal_nll(self, model_spec: str, context: str, target: str) -> tuple[float, int]:
        """Summed NLL and count of ``target``'s tokens after ``context``; with no context the first token is only
        read (``ppl_bos`` puts the model's BOS token in front, so it is scored too)."""
        import torch

        tok, model = self._load(model_spec, "causal")
        max_len = self.config.max_length
        ctx = tok(context, add_special_tokens=False).input_ids[-max_len:] if context else []
        tgt = tok(target, add_special_tokens=False).input_ids[:max_len]
        if not tgt:
            return 0.0, 0
        bos = [tok.bos_token_id] if self.config.ppl_bos and tok.bos_token_id is not None else []
        ids = bos + ctx + tgt
        start = len(bos) + len(ctx)  # first target position
        if start == 0:  # no BOS and no context: the first token has nothing to be predicted from
            start, tgt = 1, tgt[1:]
            if not tgt:
                return 0.0, 0
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
        logp = torch.log_softmax(logits[start - 1:-1], dim=-1)
        labels = torch.tensor(ids[start:], device=logp.device)
        nll = -logp.gather(1, labels[:, None]).squeeze(1)
        return float(nll.sum()), int(nll.numel())

    def _seq2seq_loglik(self, source: str, target: str) -> float:
        """neulab BARTScore: mean token log-likelihood of ``target`` given ``source`` (truncated to max_length)."""
        import torch

        tok, model = self._load(self.config.bart_model, "seq2seq")
        enc = tok(source, max_length=self.config.max_length, truncation=True, return_tensors="pt").to(model.device)
        dec = tok(target, max_length=self.config.max_length, truncation=True, return_tensors="pt").to(model.device)
        with torch.no_grad():
            out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=dec.input_ids)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        return float(logp.gather(1, dec.input_ids[0][:, None]).mean())

    # -- the two scores ----------------------------------------------------------------------------------------
    def perplexity(self, text: str) -> float:
        if text not in self._ppl:
            pieces = ppl_pieces(text, self.config.ppl_split)
            self._ppl[text] = pooled_ppl([self._causal_nll(self.config.ppl_model, "", p) for p in pieces])
        return self._ppl[text]

    def bartscore(self, source: str, target: str) -> float:
        key = (source, target)
        if key not in self._bart:
            if not target.strip():
                self._bart[key] = -math.inf
            elif self.config.bart_kind == "seq2seq":
                self._bart[key] = self._seq2seq_loglik(source, target)
            else:
                total, n = self._causal_nll(self.config.bart_model, source + BART_SEPARATOR, target)
                self._bart[key] = -total / n if n else -math.inf
        return self._bart[key]

    def anchors(self, original: str) -> Anchors:
        if original not in self._anchors:
            self._anchors[original] = Anchors(self.perplexity(original), self.bartscore(original, original))
        return self._anchors[original]

    def __call__(self, original: str, revisions: Sequence[str]) -> list[QualityScore]:
        anchors = self.anchors(original)
        out = []
        for revision in revisions:
            if not revision.strip():
                out.append(QualityScore(0.0, {"empty": True}))  # never a usable revision: the guard flags it
                continue
            out.append(d3_quality(self.perplexity(revision), self.bartscore(original, revision), anchors, self.config))
        return out

    def describe(self) -> dict:
        return asdict(self.config)
