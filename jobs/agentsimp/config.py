"""Config of the agentsimp job (paper 004): inputs, backbone, the configurations and plan knobs, evaluation.

Shared by `jobs.agentsimp.simplify` (the Ray job) and `jobs.simplify_doc_cli` (`quorum simplify-doc`), which builds the same
worker in-process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from actors.engines.base import EngineSpec
from actors.jury import JudgeConfig, JuryConfig
from actors.stage_config import LIGHT_CPU, PoolConfig, SamplingConfig, engine_secrets
from core.config import ConfigError, Section, dotted, fail, one_of, require_file
from core.corpora import hint_suffix
from core.errors import CorpusError
from core.jobrun import JobSections
from eval.agentsimp.baselines import BASELINES, read_example
from eval.agentsimp.docs import FORMATS, LINE_PARAGRAPHS
from eval.agentsimp.grammar import role_grammar
from eval.agentsimp.plan import CONFIGURATIONS, PlanConfig
from eval.agentsimp.roles import ROLE_IDS, load_role_book
from eval.agentsimp.run import PAPER_TEMPERATURE
from eval.metrics.dsari import TOKENIZATIONS

ASPECTS = ("coherence", "simplicity", "faithfulness")
# document-level roles write a whole article (or its guideline / proofread copy, or a baseline's simplification)
DOCUMENT_ROLES = ("project_director", "article_architect_direct", "proofreader", "baseline_template_1",
                  "baseline_template_2", "baseline_template_3")


@dataclass
class InputsConfig(Section):
    # .txt / .md / .html files, JSONL corpora ({id, text | paragraphs, references?}) or directories of them
    paths: list[str] = field(default_factory=lambda: ["configs/data/agentsimp_demo/corpus.jsonl"])
    # optional JSONL {id, references: [...]} (a corpus file works) giving references to file documents by id
    references_path: str = ""
    # first documents in path order (0 = all)
    limit: int = 0
    # .txt / JSONL text without a blank line: "auto" = one paragraph per line (the authors' GuoFeng loader),
    # "never" = the whole text one paragraph, "always" = every line a paragraph (eval.agentsimp.docs)
    line_paragraphs: str = "auto"

    def check(self, where: str = "") -> None:
        if not self.paths:
            fail(dotted(where, "paths"), "at least one file or directory is required")
        one_of(self.line_paragraphs, LINE_PARAGRAPHS, dotted(where, "line_paragraphs"))
        for i, path in enumerate(self.paths):
            if not Path(path).exists():
                fail(dotted(where, f"paths.{i}"), f"no such file or directory: {path}{hint_suffix(path)}")
            if Path(path).is_dir() and not self.files_in(Path(path)):
                fail(dotted(where, f"paths.{i}"), f"directory {path} holds no {', '.join(sorted(FORMATS))} file"
                     + (" besides inputs.references_path" if self.references_path else ""))

    def files_in(self, directory: Path) -> list[Path]:
        """The supported files of a directory, sorted, less the references file (the demo's corpus.jsonl holds
        the same documents as the other files)."""
        skip = Path(self.references_path).resolve() if self.references_path else None
        return sorted(p for p in directory.iterdir()
                      if p.is_file() and p.suffix.lower() in FORMATS and p.resolve() != skip)

    def files(self) -> list[Path]:
        """The input files: each file path, or the supported files of a directory (`files_in`)."""
        out = []
        for path in map(Path, self.paths):
            out += self.files_in(path) if path.is_dir() else [path]
        return out


@dataclass
class BackboneConfig(Section):
    """The LLM behind every role (the paper uses one backbone per run), its sampling and its actor pool."""

    name: str = "smollm2"  # label of the backbone in the report
    engine: EngineSpec = field(default_factory=EngineSpec)
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(batch_size=4))
    # §4.2: "We set the temperature parameter to 0.6 for all models"
    temperature: float = PAPER_TEMPERATURE
    seed: int = 0  # sampling seed of every first attempt (retries derive new seeds from it)
    # completion tokens of the paragraph-level roles and of the document-level ones (DOCUMENT_ROLES)
    max_tokens: int = 256
    document_max_tokens: int = 1024  # completion tokens of the document-level roles (DOCUMENT_ROLES)
    # role id -> tokens, overriding the two above
    role_max_tokens: dict[str, int] = field(default_factory=dict)
    # decode JSON roles under their grammar where the engine takes one (hf, vllm, openai with structured_outputs)
    constrained: bool = True
    # retries of an invalid answer (new seed, T >= 0.7) before the stage falls back to its input
    max_retries: int = 2

    def tokens(self) -> dict[str, int]:
        return {role: self.role_max_tokens.get(role, self.document_max_tokens if role in DOCUMENT_ROLES
                                              else self.max_tokens) for role in ROLE_IDS}

    def check(self, where: str = "") -> None:
        for role in self.role_max_tokens:
            one_of(role, ROLE_IDS, dotted(where, f"role_max_tokens.{role}"))
        for role, tokens in self.tokens().items():
            try:
                role_grammar(role, tokens)
            except ValueError as exc:
                fail(dotted(where, "max_tokens" if role not in self.role_max_tokens else f"role_max_tokens.{role}"),
                     str(exc))


@dataclass
class AgentsConfig(Section):
    # which of pl_direct, pl_iterative, sync_direct, sync_iterative to run (one run shares their common calls)
    configurations: list[str] = field(default_factory=lambda: list(CONFIGURATIONS))
    # knobs shared by the configurations (communication and reconstruction are set per configuration)
    plan: PlanConfig = field(default_factory=PlanConfig)
    # role id -> another prompt template (same variables)
    templates: dict[str, str] = field(default_factory=dict)
    # Table 2's single-prompt LLM baselines on the same backbone (Appendix B, templates 1-3; [] = none)
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    # template 3's in-context pair, JSON {"complex": str, "simple": str} (the paper does not print its pair)
    baseline_example_path: str = "configs/data/agentsimp_baseline_example.json"

    def example(self) -> str:
        """Template 3's rendered pair ("" when llm_t3 is not run)."""
        return read_example(self.baseline_example_path) if "llm_t3" in self.baselines else ""

    def check(self, where: str = "") -> None:
        for i, name in enumerate(self.baselines):
            one_of(name, tuple(BASELINES), dotted(where, f"baselines.{i}"))
        if len(set(self.baselines)) != len(self.baselines):
            fail(dotted(where, "baselines"), f"repeated: {self.baselines}")
        try:
            self.example()
        except CorpusError as exc:
            fail(dotted(where, "baseline_example_path"), str(exc))
        if not self.configurations:
            fail(dotted(where, "configurations"), "at least one configuration is required")
        for i, name in enumerate(self.configurations):
            one_of(name, tuple(CONFIGURATIONS), dotted(where, f"configurations.{i}"))
        if len(set(self.configurations)) != len(self.configurations):
            fail(dotted(where, "configurations"), f"repeated: {self.configurations}")
        try:
            load_role_book(self.templates)
        except ValueError as exc:
            fail(dotted(where, "templates"), str(exc))


def default_jury() -> JuryConfig:
    return JuryConfig(judges=[JudgeConfig(name=aspect, template=f"agentsimp_jury_{aspect}",
                                          sampling=SamplingConfig(max_tokens=96)) for aspect in ASPECTS])


@dataclass
class EvaluationConfig(Section):
    # BERTScore F1 against each reference (mean over references); "" = the bundled MiniLM encoder
    bertscore: bool = True
    bertscore_model_dir: str = ""  # local encoder directory for BERTScore; "" = the bundled MiniLM encoder
    # "document": every wordpiece, encoded in overlapping windows (eval.metrics.bertscore.document_bertscore);
    # "truncate": bert-score's behaviour, the first ~510 wordpieces of each text only
    bertscore_mode: str = "document"
    # D-SARI tokenisation: "script" (the reference D_SARI.py: raw text, lower().split(" ")) or "13a" (sacrebleu)
    dsari_tokenizer: str = "script"
    # document SARI: EASSE's corpus_sari over the whole document as one segment (lowercased 13a tokens); DELETE as
    # "f1" (EASSE's corpus_sari) or "precision" (Xu et al. 2016, the metric the paper cites)
    sari_deletion: str = "f1"
    # the document-level LLM jury on each configuration's output (one judge per aspect)
    jury_enabled: bool = True
    # the judges of the document-level jury (default: one per aspect, agentsimp_jury_<aspect> templates)
    jury: JuryConfig = field(default_factory=default_jury)
    # summary check (eval.agentsimp.metrics.summary_check)
    min_length_ratio: float = 0.5
    min_coverage: float = 0.5  # flag a summary when fewer than this share of source sentences are covered, in [0, 1]
    # a source sentence is covered when this share of its content-word types occurs in the output
    min_overlap: float = 0.5
    # bootstrap resamples of documents per CI (0 = none)
    n_boot: int = 1000
    seed: int = 0  # seed of the bootstrap resampling of the confidence intervals

    def check(self, where: str = "") -> None:
        one_of(self.bertscore_mode, ("document", "truncate"), dotted(where, "bertscore_mode"))
        one_of(self.dsari_tokenizer, TOKENIZATIONS, dotted(where, "dsari_tokenizer"))
        one_of(self.sari_deletion, ("f1", "precision"), dotted(where, "sari_deletion"))


@dataclass
class Config(JobSections):
    # the documents to simplify (files or directories) and their references
    inputs: InputsConfig = field(default_factory=InputsConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    # which configurations and baselines run, the plan knobs and prompt overrides
    agentsimp: AgentsConfig = field(default_factory=AgentsConfig)
    # metrics of every output: BERTScore, D-SARI, FKGL, the summary check, the LLM jury, bootstrap CIs
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)

    def validate(self) -> None:
        if self.inputs.references_path:
            require_file(self.inputs.references_path, "inputs.references_path")
        if self.ray.address or not self.ray.num_cpus:
            return
        pools = {"backbone.pool": self.backbone.pool.min_actors * self.backbone.pool.num_cpus}
        if self.evaluation.jury_enabled:
            pools["evaluation.jury"] = sum(j.pool.min_actors * j.pool.num_cpus for j in self.evaluation.jury.judges)
        for key, cpus in pools.items():
            if cpus + LIGHT_CPU > self.ray.num_cpus:
                raise ConfigError(f"{key}: the pools ask for {cpus:g} CPUs, plus {LIGHT_CPU} for Ray Data's tasks, "
                                  f"but ray.num_cpus is {self.ray.num_cpus}; lower pool.num_cpus")



def worker_kwargs(cfg: Config, cache_dir: str) -> dict:
    b = cfg.backbone
    return {"spec": dataclasses.asdict(b.engine), "plan": dataclasses.asdict(cfg.agentsimp.plan),
            "configs": list(cfg.agentsimp.configurations), "max_tokens": b.tokens(), "temperature": b.temperature,
            "seed": b.seed, "constrained": b.constrained, "max_retries": b.max_retries,
            "templates": dict(cfg.agentsimp.templates), "cache_dir": cache_dir,
            "secrets": engine_secrets(b.engine), "baselines": list(cfg.agentsimp.baselines),
            "example": cfg.agentsimp.example()}
