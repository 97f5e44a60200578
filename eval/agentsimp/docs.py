"""Documents for AgentSimp (paper 004): plain text, Markdown, HTML and JSONL corpora -> blocks and paragraphs.

The paper splits clean plain text into "paragraph-based chunks" (its code: on blank lines) and says nothing about
other formats. A `Document` is an ordered list of `Block`s of three kinds: **paragraph** (a chunk the paragraph
agents simplify), **heading** (structure: shown to the project director and the logic analyst inside the article
text, never simplified as a paragraph) and **verbatim** (code, raw HTML in Markdown, <pre>: never sent to a model,
not in the planners' article nor in the scored source; kept in the documents table with their position, see
`verbatim_blocks`; the reconstructed article does not contain them). Nothing in a file is dropped silently: every
piece of text ends up in some block.

=========  ==========================================================================================
format     segmentation
=========  ==========================================================================================
.txt       paragraphs = runs of non-blank lines; the lines of one paragraph are joined with a space
           (hard-wrapped text is unwrapped). A line "# ..." to "###### ..." (a Markdown ATX heading) is a
           heading of that level, wherever it stands. A text without any blank line but with several lines
           has one paragraph per line (the authors' GuoFeng loader splits on single newlines), unless
           `line_paragraphs="never"`; "always" splits on every line
.md        CommonMark block structure (markdown-it-py, "commonmark" preset): ATX/setext headings ->
           heading; each paragraph -> paragraph, and so each list item's and block quote's paragraph;
           fenced/indented code and HTML blocks -> verbatim. Inline markup is reduced to its text (link
           and image text kept, URLs dropped; soft and hard line breaks become spaces)
.html      lxml's HTML parser (libxml2; implied end tags such as an unclosed <p> or <li> handled like
           a browser). <script>, <style>, <noscript>, <template>, comments and <head> are not text.
           <h1>-<h6> -> heading; <pre> -> verbatim; every maximal run of inline content inside a
           block element (<p>, <li>, <div>, <td>, <blockquote>, ...) -> one paragraph, so <li> items,
           text loose in a <div> and the text after a nested list all become paragraphs; <br> is a space
.jsonl     one document per line: {"id": str, "text": str | "paragraphs": [str, ...],
           "references": [str, ...]?}; text is segmented like .txt, a "paragraphs" item that is a heading
           line is a heading; no other key is allowed
=========  ==========================================================================================

A single .txt/.md/.html file is one document whose id is the file stem. Bad input raises
`core.errors.CorpusError` naming the file and line: not UTF-8, malformed JSON, unknown or missing keys, empty
texts, duplicate ids, a document without any paragraph.

Pure: no ray, vllm, deepspeed or torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lxml.etree
import lxml.html
from markdown_it import MarkdownIt

from core.errors import CorpusError
from core.files import json_object, read_utf8
from core.text import is_blank
from eval.agentsimp.roles import join_paragraphs

FORMATS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
           ".htm": "html", ".jsonl": "jsonl"}
JSONL_KEYS = ("id", "text", "paragraphs", "references")
_HEADINGS = {f"h{k}": k for k in range(1, 7)}
_NOT_TEXT = ("script", "style", "noscript", "template", "head")
_BLOCK_TAG_NAMES = (
    "address article aside blockquote body caption center dd details dialog dir div dl dt fieldset figcaption figure "
    "footer form header hgroup hr html legend li main menu nav ol p section summary table tbody td tfoot th thead "
    "tr ul"
)
_BLOCK_TAGS = frozenset(_BLOCK_TAG_NAMES.split())
_SPACE = re.compile(r"\s+")
_BLANK_SPLIT = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_ATX = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
LINE_PARAGRAPHS = ("auto", "never", "always")


@dataclass(frozen=True)
class Block:
    """A piece of a document: kind "paragraph", "heading" (level 1-6) or "verbatim"; `line` is 1-based (0 unknown)."""

    kind: str
    text: str
    level: int = 0
    line: int = 0


@dataclass(frozen=True)
class Document:
    """One document: its blocks in order, optional references, and where it came from ("path" or "path:line")."""

    id: str
    blocks: tuple[Block, ...]
    references: tuple[str, ...] = ()
    origin: str = ""

    @property
    def paragraphs(self) -> tuple[str, ...]:
        """The chunks to simplify, in order."""
        return tuple(b.text for b in self.blocks if b.kind == "paragraph")

    @property
    def text(self) -> str:
        """The simplified part of the document (its paragraphs, blank-line separated): the source for metrics."""
        return join_paragraphs(self.paragraphs)

    @property
    def article(self) -> str:
        """The document for the planners: headings as Markdown "#" lines and paragraphs (verbatim blocks left out)."""
        return join_paragraphs([f"{'#' * b.level} {b.text}" if b.kind == "heading" else b.text
                                for b in self.blocks if b.kind != "verbatim"])

    @property
    def verbatim_blocks(self) -> tuple[tuple[int, str], ...]:
        """(number of paragraphs before it, text) of every verbatim block: where it stood among the paragraphs."""
        out, seen = [], 0
        for block in self.blocks:
            if block.kind == "paragraph":
                seen += 1
            elif block.kind == "verbatim":
                out.append((seen, block.text))
        return tuple(out)


# ----------------------------------------------------------------------------- segmentation


def segment_text(text: str, first_line: int = 1, line_paragraphs: str = "auto") -> list[Block]:
    """Plain text -> heading and paragraph blocks (module docstring: runs of non-blank lines, unwrapped; "#" lines
    are headings; a text without a blank line has a paragraph per line unless `line_paragraphs` is "never").

    >>> [(b.text, b.line) for b in segment_text("One\\ntwo.\\n\\n\\nThree.\\n")]
    [('One two.', 1), ('Three.', 5)]
    >>> [(b.kind, b.text, b.level) for b in segment_text("## Fares\\nBus fares rise.\\nTrains stay.")]
    [('heading', 'Fares', 2), ('paragraph', 'Bus fares rise.', 0), ('paragraph', 'Trains stay.', 0)]
    """
    if line_paragraphs not in LINE_PARAGRAPHS:
        raise ValueError(f"line_paragraphs must be one of {', '.join(LINE_PARAGRAPHS)}, got {line_paragraphs!r}")
    text = text.replace("\r\n", "\n")
    by_line = line_paragraphs == "always" or (
        line_paragraphs == "auto" and not _BLANK_SPLIT.search(text.strip()) and "\n" in text.strip())
    blocks, run = [], []

    def flush():
        if run:
            blocks.append(Block("paragraph", _SPACE.sub(" ", " ".join(t for t, _ in run)).strip(), line=run[0][1]))
            run.clear()

    for number, raw in enumerate(text.split("\n"), first_line):
        heading = _ATX.match(raw)
        if not raw.strip() or heading:
            flush()
            if heading and heading.group(2).strip():
                blocks.append(Block("heading", heading.group(2).strip(), len(heading.group(1)), number))
            continue
        run.append((raw, number))
        if by_line:
            flush()
    flush()
    return blocks


def segment_markdown(text: str) -> list[Block]:
    """Markdown -> blocks by CommonMark block structure (module docstring).

    >>> [(b.kind, b.text) for b in segment_markdown("# A *b*\\n\\nSome [text](u).\\n\\n- one\\n- two\\n")]
    [('heading', 'A b'), ('paragraph', 'Some text.'), ('paragraph', 'one'), ('paragraph', 'two')]
    """
    blocks, heading = [], 0
    for token in MarkdownIt("commonmark").parse(text):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "heading_open":
            heading = int(token.tag[1])
        elif token.type == "heading_close":
            heading = 0
        elif token.type == "inline":
            content = _SPACE.sub(" ", "".join(_inline_text(child) for child in token.children or ())).strip()
            if content:
                blocks.append(Block("heading", content, heading, line) if heading else Block("paragraph", content,
                                                                                             line=line))
        elif token.type in ("fence", "code_block", "html_block") and token.content.strip():
            blocks.append(Block("verbatim", token.content.rstrip("\n"), line=line))
    return blocks


def _inline_text(token) -> str:
    if token.type in ("text", "code_inline", "image"):
        return token.content
    return " " if token.type in ("softbreak", "hardbreak") else ""


def segment_html(text: str, where: str = "<html>") -> list[Block]:
    """HTML -> blocks (module docstring). Raises CorpusError naming `where` for a document lxml cannot parse.

    >>> [(b.kind, b.text) for b in segment_html("<h2>T</h2><p>A<br>b<ul><li>x<li>y</ul><script>z</script>")]
    [('heading', 'T'), ('paragraph', 'A b'), ('paragraph', 'x'), ('paragraph', 'y')]
    """
    try:
        root = lxml.html.document_fromstring(text)
    except (lxml.etree.ParserError, ValueError) as err:
        raise CorpusError(f"{where}: cannot parse HTML: {err}") from None
    for element in list(root.iter(lxml.etree.Comment, lxml.etree.ProcessingInstruction, *_NOT_TEXT)):
        if element.getparent() is not None:
            element.drop_tree()  # keeps the element's tail text
    blocks: list[Block] = []
    run: list[tuple[str, int]] = []
    _walk(root, blocks, run)
    _flush(run, blocks)
    return blocks


def _walk(element, blocks: list[Block], run: list) -> None:
    tag = element.tag.lower() if isinstance(element.tag, str) else ""
    line = element.sourceline or 0
    if tag in _HEADINGS:
        _flush(run, blocks)
        heading = _SPACE.sub(" ", element.text_content()).strip()
        if heading:
            blocks.append(Block("heading", heading, _HEADINGS[tag], line))
    elif tag == "pre":
        _flush(run, blocks)
        if element.text_content().strip():
            blocks.append(Block("verbatim", element.text_content().strip("\n"), line=line))
    elif tag in _BLOCK_TAGS:
        _flush(run, blocks)
        inner = [(element.text, line)] if element.text else []
        for child in element:
            _walk(child, blocks, inner)
        _flush(inner, blocks)
    else:
        run.append((" " if tag == "br" else element.text or "", line))
        for child in element:
            _walk(child, blocks, run)
    if element.tail:
        run.append((element.tail, line))


def _flush(run: list, blocks: list[Block]) -> None:
    content = _SPACE.sub(" ", "".join(piece for piece, _ in run)).strip()
    if content:
        line = next((ln for piece, ln in run if piece.strip()), 0)
        blocks.append(Block("paragraph", content, line=line))
    run.clear()


# ----------------------------------------------------------------------------- files


def read_document(path, fmt: str = "auto", line_paragraphs: str = "auto") -> Document:
    """One .txt/.md/.html file as a Document with id = file stem.

    Raises:
        CorpusError: missing file, unknown format, not UTF-8, or no paragraph in it.
    """
    path = Path(path)
    fmt = _format(path, fmt)
    if fmt == "jsonl":
        raise CorpusError(f"{path}: a JSONL corpus holds several documents; read it with read_corpus")
    text = _read(path)
    readers = {"text": lambda t: segment_text(t, line_paragraphs=line_paragraphs), "markdown": segment_markdown}
    blocks = readers.get(fmt, lambda t: segment_html(t, str(path)))(text)
    document = Document(path.stem, tuple(blocks), (), str(path))
    if not document.paragraphs:
        raise CorpusError(f"{path}: no paragraph to simplify ({len(blocks)} headings or verbatim blocks only)")
    if all(is_blank(p) for p in document.paragraphs):
        raise CorpusError(f"{path}: no paragraph to simplify (its paragraphs hold only zero-width or control "
                          "characters)")
    return document


def read_corpus(path, line_paragraphs: str = "auto") -> tuple[Document, ...]:
    """A JSONL corpus (module docstring); blank lines are skipped, everything else must be a valid document."""
    path = Path(path)
    documents, seen = [], {}
    for number, line in enumerate(_read(path).split("\n"), 1):
        if not line.strip():
            continue
        document = _jsonl_document(path, number, line, line_paragraphs)
        if document.id in seen:
            raise CorpusError(f"{path}: line {number}: duplicate id {document.id!r} (first on line {seen[document.id]})")
        seen[document.id] = number
        documents.append(document)
    if not documents:
        raise CorpusError(f"{path} is empty (no document)")
    return tuple(documents)


def read_documents(paths: Sequence, line_paragraphs: str = "auto") -> tuple[Document, ...]:
    """Documents from files of any supported format (JSONL files may hold several); ids must be unique.

    Raises:
        CorpusError: also when `paths` hold no document at all.
    """
    documents, origin = [], {}
    for path in paths:
        found = (read_corpus(path, line_paragraphs) if _format(Path(path), "auto") == "jsonl" else
                 (read_document(path, line_paragraphs=line_paragraphs),))
        for document in found:
            if document.id in origin:
                raise CorpusError(f"{document.origin}: duplicate document id {document.id!r} "
                                  f"(also {origin[document.id]})")
            origin[document.id] = document.origin
            documents.append(document)
    if not documents:
        raise CorpusError(f"no document in {', '.join(map(str, paths)) or 'the input paths (none given)'}")
    return tuple(documents)


def _format(path: Path, fmt: str) -> str:
    resolved = FORMATS.get(path.suffix.lower()) if fmt == "auto" else fmt
    if resolved not in set(FORMATS.values()):
        raise CorpusError(f"{path}: format {fmt!r} (extension {path.suffix!r}) is not one of "
                          f"{', '.join(sorted(FORMATS))}")
    return resolved


def _read(path: Path) -> str:
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    return read_utf8(path, CorpusError)


def _jsonl_document(path: Path, number: int, line: str, line_paragraphs: str = "auto") -> Document:
    where = f"{path}: line {number}"
    record = json_object(line, where, CorpusError)
    unknown = sorted(set(record) - set(JSONL_KEYS))
    if unknown:
        raise CorpusError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(JSONL_KEYS)})")
    doc_id = record.get("id")
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise CorpusError(f"{where}: 'id' must be a non-empty string, got {doc_id!r}")
    if ("text" in record) == ("paragraphs" in record):
        raise CorpusError(f"{where}: give exactly one of 'text' and 'paragraphs'")
    if "text" in record:
        if not isinstance(record["text"], str) or is_blank(record["text"]):
            raise CorpusError(f"{where}: 'text' must be a non-empty string")
        blocks = tuple(segment_text(record["text"], line_paragraphs=line_paragraphs))
    else:
        paragraphs = _strings(record["paragraphs"], "paragraphs", where)
        if not paragraphs:
            raise CorpusError(f"{where}: 'paragraphs' must not be empty")
        blocks = tuple(Block("heading", m.group(2).strip(), len(m.group(1))) if (m := _ATX.fullmatch(p.strip()))
                       and m.group(2).strip() else Block("paragraph", _SPACE.sub(" ", p).strip()) for p in paragraphs)
    if not any(b.kind == "paragraph" for b in blocks):
        raise CorpusError(f"{where}: no paragraph to simplify (headings only)")
    references = _strings(record.get("references", []), "references", where)
    return Document(doc_id, blocks, tuple(references), f"{path}:{number}")


def _strings(value, key: str, where: str) -> list[str]:
    if not isinstance(value, list):
        raise CorpusError(f"{where}: {key!r} must be a list of strings, got {type(value).__name__}")
    for k, item in enumerate(value):
        if not isinstance(item, str) or is_blank(item):
            raise CorpusError(f"{where}: {key}[{k}] must be a non-empty string, got {item!r}")
    return list(value)
