"""Prompt templates as data: load, validate and render `configs/prompts/<name>.yaml`.

A template file has four keys::

    description: what the prompt is for
    source: "paper 000, Fig. 5a"        # where the text comes from
    variables: [input]                  # placeholders the messages use
    messages:
      - {role: system, content: "..."}
      - {role: user, content: "{input}"}

Placeholder rules (one pass over the text, so substituted values are never re-scanned):

- ``{name}`` where ``name`` is a Python identifier is a placeholder. It must be declared in
  ``variables``, and every declared variable must be used by at least one message.
- ``{{`` and ``}}`` render as literal ``{`` and ``}``.
- Any other brace, e.g. ``{Lexical / Structural / Overall}`` in paper 000's guideline or a JSON
  example such as ``{"a": 1}``, is left untouched.

The pre-rendered blocks of the paper-000 judge prompt (``judge_policy.yaml``: candidates, word alignments and
constituency parses) are built in `eval.judging.blocks`.

Example::

    from eval.prompts import load_template, prompt_path
    messages = load_template(prompt_path("simplify_lexical_zeroshot")).render(input="A sentence.")

This module is pure: it never imports ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from core.config import ConfigError, FieldCheck
from core.files import load_yaml, read_utf8

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "configs" / "prompts"
ROLES = ("system", "user", "assistant")
REQUIRED_KEYS = ("description", "source", "variables", "messages")


_TOKEN_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PromptError(ValueError):
    """A template file is malformed, or render() got the wrong values."""


@dataclass(frozen=True)
class PromptTemplate:
    """A validated chat prompt template.

    Attributes:
        name: File stem, e.g. ``"jury_score"``; used in error messages.
        description: Free text from the file.
        source: Where the prompt text comes from (paper and figure).
        variables: Declared placeholder names, in file order.
        messages: ``({"role": ..., "content": ...}, ...)`` with placeholders unrendered.
    """

    name: str
    description: str
    source: str
    variables: tuple[str, ...]
    messages: tuple[dict, ...]

    def render(self, **values: str) -> list[dict]:
        """Substitute every declared placeholder and return fresh message dicts.

        Args:
            **values: One string per declared variable; no more, no fewer.

        Returns:
            ``[{"role": ..., "content": ...}, ...]`` ready for a chat template.

        Raises:
            PromptError: A declared variable is missing, an undeclared one is given, or a value
                is not a string. The message names the template and the variable.
        """
        missing = [v for v in self.variables if v not in values]
        if missing:
            raise PromptError(f"template {self.name!r}: missing variable {missing[0]!r}")
        extra = sorted(set(values) - set(self.variables))
        if extra:
            raise PromptError(f"template {self.name!r}: undeclared variable {extra[0]!r}")
        for key, value in values.items():
            if not isinstance(value, str):
                raise PromptError(f"template {self.name!r}: variable {key!r} must be str, got {type(value).__name__}")
        return [{"role": m["role"], "content": _substitute(m["content"], values)} for m in self.messages]


def _substitute(text: str, values: dict[str, str]) -> str:
    def replace(match: re.Match) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return values[match.group(1)]

    return _TOKEN_RE.sub(replace, text)


def find_placeholders(text: str) -> list[str]:
    """Return the placeholder names used in ``text``, in order of appearance.

    Args:
        text: Template text.

    Returns:
        Names of ``{identifier}`` placeholders; escaped ``{{x}}`` and non-identifier braces are skipped.

    >>> find_placeholders('Aspect: {Lexical / Overall} {input} {{literal}} {"k": 1} {input}')
    ['input', 'input']
    """
    return [m.group(1) for m in _TOKEN_RE.finditer(text) if m.group(1)]


# -----------------------------------------------------------------------------
# Loading and validation


def prompt_path(name_or_path: str | Path) -> Path:
    """Resolve a template name to ``configs/prompts/<name>.yaml``, or pass an explicit path through.

    Args:
        name_or_path: A bare name such as ``"jury_score"``, or a path (anything containing a path
            separator or ending in ``.yaml``/``.yml``).

    Returns:
        The path; existence is checked by :func:`load_template`.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or "\\" in text or text.endswith((".yaml", ".yml")):
        return Path(name_or_path)
    return PROMPTS_DIR / f"{text}.yaml"


def load_template(path: str | Path) -> PromptTemplate:
    """Load and validate a template file.

    Args:
        path: Path to the YAML file (see :func:`prompt_path`).

    Returns:
        The validated template.

    Raises:
        PromptError: On any structural problem; the message names the file and, for message
            problems, the message index.
    """
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"{path}: template file not found")
    data = load_yaml(read_utf8(path, PromptError), str(path), PromptError)
    if not isinstance(data, dict):
        raise PromptError(f"{path}: top level must be a mapping")
    _check_keys(path, data)
    variables = _check_variables(path, data["variables"])
    messages = tuple(_check_message(path, i, m) for i, m in enumerate(_as_list(path, data["messages"])))
    _check_placeholders(path, variables, messages)
    return PromptTemplate(path.stem, data["description"], data["source"], variables, messages)


def check_template(name: str, key: str) -> None:
    """A prompt template name (configs/prompts/<name>.yaml) or path must load; the error names config key `key`."""
    try:
        load_template(prompt_path(name))
    except PromptError as exc:
        raise ConfigError(f"{key}: {exc}") from None


# a config field naming a prompt template ("" = the job's default); checked with every config (core.config)
TemplateName = Annotated[str, FieldCheck(check_template)]


def _check_keys(path: Path, data: dict) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise PromptError(f"{path}: missing key {missing[0]!r}")
    unknown = sorted(set(data) - set(REQUIRED_KEYS))
    if unknown:
        raise PromptError(f"{path}: unknown key {unknown[0]!r}")
    for key in ("description", "source"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise PromptError(f"{path}: {key!r} must be a non-empty string")


def _check_variables(path: Path, variables: object) -> tuple[str, ...]:
    if not isinstance(variables, list):
        raise PromptError(f"{path}: 'variables' must be a list")
    for v in variables:
        if not isinstance(v, str) or not v.isidentifier():
            raise PromptError(f"{path}: variable {v!r} is not an identifier")
    if len(set(variables)) != len(variables):
        raise PromptError(f"{path}: duplicate entries in 'variables'")
    return tuple(variables)


def _as_list(path: Path, messages: object) -> list:
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{path}: 'messages' must be a non-empty list")
    return messages


def _check_message(path: Path, index: int, message: object) -> dict:
    where = f"{path}: messages[{index}]"
    if not isinstance(message, dict) or set(message) != {"role", "content"}:
        raise PromptError(f"{where}: must be a mapping with exactly 'role' and 'content'")
    if message["role"] not in ROLES:
        raise PromptError(f"{where}: role {message['role']!r} not in {ROLES}")
    if not isinstance(message["content"], str):
        raise PromptError(f"{where}: content must be a string")
    return {"role": message["role"], "content": message["content"]}


def _check_placeholders(path: Path, variables: tuple[str, ...], messages: tuple[dict, ...]) -> None:
    used: set[str] = set()
    for i, message in enumerate(messages):
        for name in find_placeholders(message["content"]):
            if name not in variables:
                raise PromptError(f"{path}: messages[{i}]: placeholder {{{name}}} is not declared in 'variables'")
            used.add(name)
    unused = [v for v in variables if v not in used]
    if unused:
        raise PromptError(f"{path}: variable {unused[0]!r} is declared but no message uses it")
