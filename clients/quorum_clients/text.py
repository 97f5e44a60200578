"""What the judge reads: trainer prompts and responses normalised before judging.

Trainers hand a reward function text in their own shapes: TRL a string or a list of chat messages, OpenRLHF the
decoded prompt (chat template applied, special tokens kept), verl the dataset's chat messages. The judge should see
the conversation, not the template: chat-template markup (ChatML, Llama 3, Gemma, Mistral's [INST]) is taken
apart into its turns, the roles are kept, and a message without text is refused, never rendered as "None".

A conversation of one user turn (the usual prompt) is that turn's text; a longer one keeps its roles, one block per
turn ("System: ...", "User: ...", "Assistant: ..."). A generation prompt's empty assistant header is dropped.

    >>> prompt_text("<|im_start|>user\\nWrite a haiku.<|im_end|>\\n<|im_start|>assistant\\n")
    'Write a haiku.'
    >>> prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    'System: Be brief.\\n\\nUser: Hi'
    >>> response_text("A calm lake.<|im_end|>")
    'A calm lake.'

Pure: the standard library.
"""

from __future__ import annotations

import re

# one chat turn per template family: (role, text) groups; the closing token is optional (a generation prompt's
# last header has none)
_TURNS = (
    re.compile(r"<\|im_start\|>(\w+)\n?(.*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|$)", re.DOTALL),  # ChatML
    re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*(.*?)(?:<\|eot_id\|>|(?=<\|start_header_id\|>)|$)",
               re.DOTALL),  # Llama 3
    re.compile(r"<start_of_turn>(\w+)\n?(.*?)(?:<end_of_turn>|(?=<start_of_turn>)|$)", re.DOTALL),  # Gemma
)
_INST = re.compile(r"\[INST\](.*?)\[/INST\]", re.DOTALL)  # Llama 2 / Mistral: user turns only
# stray special tokens a decode with skip_special_tokens=False leaves (BOS/EOS and the like)
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]+\|>|</?s>|<eos>|<bos>|<end_of_turn>|<start_of_turn>|<pad>")
_ROLE_NAMES = {"system": "System", "user": "User", "human": "User", "assistant": "Assistant", "model": "Assistant",
               "gpt": "Assistant", "tool": "Tool", "ipython": "Tool", "function": "Tool", "developer": "System"}


class TextError(ValueError):
    """A prompt or response the judge cannot be given (a message without text, an unknown shape)."""


def prompt_text(value, where: str = "prompt") -> str:
    """A prompt as the judge reads it: a string (chat markup parsed into turns) or a list of messages."""
    return render_turns(_turns(value, where), where)


def response_text(value, where: str = "response") -> str:
    """A response as the judge reads it: the assistant's text, markup and end-of-turn tokens stripped."""
    turns = _turns(value, where)
    if all(role in ("assistant", "model", "gpt") for role, _ in turns):
        return "\n\n".join(text for _, text in turns).strip()
    return render_turns(turns, where)


def render_turns(turns: list[tuple[str, str]], where: str = "prompt") -> str:
    turns = [(role, text) for role, text in turns if text.strip() or role not in ("assistant", "model", "gpt")]
    if not turns:
        raise TextError(f"{where}: no text to judge")
    if len(turns) == 1 and turns[0][0] in ("user", "human", ""):
        return turns[0][1].strip()
    return "\n\n".join(f"{_ROLE_NAMES.get(role, role.capitalize())}: {text.strip()}" if role else text.strip()
                       for role, text in turns)


def _turns(value, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return _string_turns(value)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, (list, tuple)):
        return [(_role(m, where, i), _content(m, where, i)) for i, m in enumerate(value)]
    raise TextError(f"{where}: expected a string or a list of chat messages, got {type(value).__name__}")


def _string_turns(text: str) -> list[tuple[str, str]]:
    for pattern in _TURNS:
        found = pattern.findall(text)
        if found:
            return [(role.lower(), _SPECIAL.sub("", body)) for role, body in found]
    inst = _INST.findall(text)
    if inst:
        rest = text[text.rfind("[/INST]") + len("[/INST]"):]
        turns = [("user", _SPECIAL.sub("", body)) for body in inst]
        return turns + ([("assistant", _SPECIAL.sub("", rest))] if _SPECIAL.sub("", rest).strip() else [])
    return [("", _SPECIAL.sub("", text))]


def _role(message, where: str, i: int) -> str:
    if not isinstance(message, dict):
        raise TextError(f"{where}[{i}]: expected a chat message (a dict with role and content), got "
                        f"{type(message).__name__}")
    return str(message.get("role", "")).lower()


def _content(message: dict, where: str, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return _SPECIAL.sub("", content)
    if isinstance(content, list):  # content blocks: the text ones (an image block has nothing a text judge reads)
        texts = [block.get("text") for block in content if isinstance(block, dict) and block.get("type", "text") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return _SPECIAL.sub("", "".join(texts))
    raise TextError(f"{where}[{i}] ({message.get('role', 'no role')}): content {content!r} holds no text for the "
                    "judge (a tool call or a tool message without content cannot be judged as text)")
