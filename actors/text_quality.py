"""CRAFT's model-based text-quality scorer (paper 002, App. D.3): perplexity and BARTScore behind R_g and S_r.

``build_quality(config)`` returns the :data:`eval.craft.quality.QualityFn` that ``eval.craft.agent.Systems`` (the
agent's step reward and ``text_eval()``), TG-MCTS's R_g and Eq. 1's S_r call: ``score(original, revisions)``. With
``metric: d3`` it is :class:`QualityScorer`, which holds the models; with ``metric: difflib`` the old pure proxy.

- **Layout**: every text (the input and each revision) is scored as one paragraph (``layout: paragraph``: lines
  stripped and joined with spaces, ``eval.craft.quality.paragraph_layout``), so no system's answer scores better
  or worse for its line breaks.
- **Perplexity** (fluency): a causal LM (paper: GPT-2 Large). The text is cut into pieces (``ppl_split``: the
  authors' code splits on ``". "``), each piece cut at ``ppl_max_length`` tokens (the authors' 512) and scored
  without a BOS token, as the authors' code does (GPT-2 with ``labels = input_ids``): a piece's first token is only
  read, never predicted (``ppl_bos`` puts the model's BOS token in front so it is scored too). The token NLLs are
  pooled: ``exp(sum NLL / tokens)``.
- **BARTScore** (coherence): ``seq2seq`` = neulab's BARTScorer, the mean token log-likelihood of the revision
  given the input under an encoder-decoder (paper's code: ``facebook/bart-large-cnn``), each side cut at
  ``bart_max_length`` tokens (neulab's 1024); ``causal`` = the CPU stand-in, the mean log-likelihood of the
  revision's first ``bart_max_length`` tokens after the input's last ``bart_max_length`` tokens and a blank line
  under a causal LM. A cut is recorded in the score's parts (``bart_cut``), never silent.
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
    paragraph_layout,
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

    def _causal_nll(self, model_spec: str, context: str, target: str, max_len: int) -> tuple[float, int, bool]:
        """Summed NLL and count of ``target``'s tokens after ``context`` (the context's last and the target's first
        ``max_len`` tokens; the third value says whether either was cut). With no context the first token is only
        read (``ppl_bos`` puts the model's BOS token in front, so it is scored too)."""
        import torch

        tok, model = self._load(model_spec, "causal")
        ctx_all = tok(context, add_special_tokens=False).input_ids if context else []
        tgt_all = tok(target, add_special_tokens=False).input_ids
        ctx, tgt = ctx_all[-max_len:], tgt_all[:max_len]
        cut = len(ctx_all) > max_len or len(tgt_all) > max_len
        if not tgt:
            return 0.0, 0, cut
        bos = [tok.bos_token_id] if self.config.ppl_bos and tok.bos_token_id is not None else []
        ids = bos + ctx + tgt
        start = len(bos) + len(ctx)  # first target position
        if start == 0:  # no BOS and no context: the first token has nothing to be predicted from
            start, tgt = 1, tgt[1:]
            if not tgt:
                return 0.0, 0, cut
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
        logp = torch.log_softmax(logits[start - 1:-1], dim=-1)
        labels = torch.tensor(ids[start:], device=logp.device)
        nll = -logp.gather(1, labels[:, None]).squeeze(1)
        return float(nll.sum()), int(nll.numel()), cut

    def _seq2seq_loglik(self, source: str, target: str) -> tuple[float, bool]:
        """neulab BARTScore: mean token log-likelihood of ``target`` given ``source``, each cut at
        ``bart_max_length`` tokens (the second value says whether either was cut)."""
        import torch

        tok, model = self._load(self.config.bart_model, "seq2seq")
        limit = self.config.bart_max_length
        cut = any(len(tok(t).input_ids) > limit for t in (source, target))
        enc = tok(source, max_length=limit, truncation=True, return_tensors="pt").to(model.device)
        dec = tok(target, max_length=limit, truncation=True, return_tensors="pt").to(model.device)
        with torch.no_grad():
            out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=dec.input_ids)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        return float(logp.gather(1, dec.input_ids[0][:, None]).mean()), cut

    # -- the two scores ----------------------------------------------------------------------------------------
    def perplexity(self, text: str) -> float:
        if text not in self._ppl:
            pieces = ppl_pieces(text, self.config.ppl_split)
            losses = [self._causal_nll(self.config.ppl_model, "", p, self.config.ppl_max_length)[:2] for p in pieces]
            self._ppl[text] = pooled_ppl(losses)
        return self._ppl[text]

    def bartscore(self, source: str, target: str) -> float:
        return self._bartscore(source, target)[0]

    def _bartscore(self, source: str, target: str) -> tuple[float, bool]:
        key = (source, target)
        if key not in self._bart:
            if not target.strip():
                self._bart[key] = (-math.inf, False)
            elif self.config.bart_kind == "seq2seq":
                self._bart[key] = self._seq2seq_loglik(source, target)
            else:
                total, n, cut = self._causal_nll(self.config.bart_model, source + BART_SEPARATOR, target,
                                                 self.config.bart_max_length)
                self._bart[key] = (-total / n if n else -math.inf, cut)
        return self._bart[key]

    def layout(self, text: str) -> str:
        return paragraph_layout(text) if self.config.layout == "paragraph" else text

    def anchors(self, original: str) -> Anchors:
        original = self.layout(original)
        if original not in self._anchors:
            self._anchors[original] = Anchors(self.perplexity(original), self.bartscore(original, original))
        return self._anchors[original]

    def __call__(self, original: str, revisions: Sequence[str]) -> list[QualityScore]:
        anchors = self.anchors(original)
        original = self.layout(original)
        out = []
        for revision in revisions:
            if not revision.strip():
                out.append(QualityScore(0.0, {"empty": True}))  # never a usable revision: the guard flags it
                continue
            revision = self.layout(revision)
            bart, cut = self._bartscore(original, revision)
            score = d3_quality(self.perplexity(revision), bart, anchors, self.config)
            # a text longer than bart_max_length is scored on its cut: kept and counted, never silent
            score.parts["bart_cut"] = cut or self._bartscore(original, original)[1]
            out.append(score)
        return out

    def describe(self) -> dict:
        return asdict(self.config)
