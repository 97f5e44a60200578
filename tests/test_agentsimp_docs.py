"""AgentSimp document inputs (eval.agentsimp.docs): each format segments as documented; bad input names file and line.

Fixtures: tests/fixtures/agentsimp/ (notice.txt, leaflet.md, explainer.html, corpus.jsonl); the demo documents in
configs/data/agentsimp_demo/ are checked too (the job's demo reads them).
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from core.errors import CorpusError
from eval.agentsimp import docs as agentsimp_docs
from eval.agentsimp.docs import Block, read_corpus, read_document, read_documents, segment_html, segment_markdown

FIXTURES = Path(__file__).parent / "fixtures" / "agentsimp"
DEMO = Path(__file__).resolve().parents[1] / "configs" / "data" / "agentsimp_demo"


def test_doctests_pass():
    assert doctest.testmod(agentsimp_docs).failed == 0


def test_plain_text_paragraphs_are_blank_line_runs_unwrapped():
    doc = read_document(FIXTURES / "notice.txt")
    assert doc.id == "notice" and doc.origin.endswith("notice.txt")
    assert doc.blocks == (
        Block("paragraph", "The council will resurface Mill Road in May.", line=1),
        Block("paragraph", "Buses will be diverted via Station Street.", line=6),
        Block("paragraph", "Residents may object until 30 April.", line=9),
    )
    assert doc.text == doc.article == (
        "The council will resurface Mill Road in May.\n\nBuses will be diverted via Station Street.\n\n"
        "Residents may object until 30 April.")


def test_markdown_block_structure():
    doc = read_document(FIXTURES / "leaflet.md")
    assert [(b.kind, b.text, b.level, b.line) for b in doc.blocks] == [
        ("heading", "Taking Ibuprofen", 1, 1),
        ("paragraph", "Ibuprofen relieves pain and reduces inflammation.", 0, 3),
        ("heading", "Side effects", 2, 6),
        ("paragraph", "stomach ache", 0, 9),
        ("paragraph", "dizziness, rarely", 0, 10),
        ("paragraph", "Ask a pharmacist if unsure.", 0, 12),
        ("verbatim", "dose = 200 mg", 0, 14),
        ("paragraph", "A pill box keep it dry.", 0, 18),
    ]
    # headings are structure: not chunks to simplify, but shown to the planners
    assert doc.paragraphs == ("Ibuprofen relieves pain and reduces inflammation.", "stomach ache",
                              "dizziness, rarely", "Ask a pharmacist if unsure.", "A pill box keep it dry.")
    assert doc.article.startswith("# Taking Ibuprofen\n\nIbuprofen relieves pain")
    assert "## Side effects\n\nstomach ache" in doc.article
    # code is never sent to a model: not in the planners' article, kept with its place among the paragraphs
    assert "dose = 200 mg" not in doc.article and doc.verbatim_blocks == ((4, "dose = 200 mg"),)


def test_html_blocks_by_parser_not_regex():
    doc = read_document(FIXTURES / "explainer.html")
    assert [(b.kind, b.text, b.level) for b in doc.blocks] == [
        ("heading", "How a heat pump works", 1),
        ("paragraph", "A heat pump moves heat instead of making it.", 0),
        ("paragraph", "It uses electricity to run a compressor.", 0),  # <p> closed by the next <p>; <br> a space
        ("paragraph", "Air source", 0),
        ("paragraph", "Ground source", 0),
        ("paragraph", "vertical loops", 0),
        ("paragraph", "and horizontal loops", 0),  # text after a nested list is not lost
        ("paragraph", "Installers offer surveys.", 0),  # loose text in a <div>
        ("paragraph", "Grants exist.", 0),
        ("paragraph", "Ask your council.", 0),
        ("verbatim", "COP = heat / power", 0),
    ]
    text = " ".join(b.text for b in doc.blocks)
    for hidden in ("tracking", "color", "hidden note", "Enable scripts", "Heat pumps"):
        assert hidden not in text
    assert doc.blocks[1].line == 7 and doc.blocks[3].line == 9


def test_html_edge_cases():
    assert segment_html("<p>a &amp; b</p><table><tr><td>x</td><td>y</td></tr></table>") == [
        Block("paragraph", "a & b", line=1), Block("paragraph", "x", line=1), Block("paragraph", "y", line=1)]
    assert segment_html("just text, no tags") == [Block("paragraph", "just text, no tags", line=1)]
    with pytest.raises(CorpusError, match="x.html: cannot parse HTML"):
        segment_html("", "x.html")


def test_markdown_setext_and_nested_lists():
    blocks = segment_markdown("Title\n=====\n\n1. one\n   - inner\n2. two\n")
    assert [(b.kind, b.text) for b in blocks] == [("heading", "Title"), ("paragraph", "one"), ("paragraph", "inner"),
                                                  ("paragraph", "two")]


def test_jsonl_corpus():
    docs = read_corpus(FIXTURES / "corpus.jsonl")
    assert [d.id for d in docs] == ["a", "b"]
    assert docs[0].paragraphs == ("First paragraph wrapped.", "Second one.")
    assert docs[0].references == ("Simple first.\n\nSimple second.", "Another reference.")
    assert docs[0].origin.endswith("corpus.jsonl:1") and docs[1].origin.endswith("corpus.jsonl:3")
    assert docs[1].paragraphs == ("Only one paragraph.",) and docs[1].references == ()


@pytest.mark.parametrize("line,message", [
    ('{"id": "a", "text": "x"', "line 2: not valid JSON"),
    ('["a"]', "line 2: expected a JSON object, got list"),
    ('{"id": "a", "txt": "x"}', "line 2: unknown key 'txt'"),
    ('{"id": "", "text": "x"}', "line 2: 'id' must be a non-empty string"),
    ('{"id": "a"}', "line 2: give exactly one of 'text' and 'paragraphs'"),
    ('{"id": "a", "text": "x", "paragraphs": ["x"]}', "line 2: give exactly one of"),
    ('{"id": "a", "text": "  "}', "line 2: 'text' must be a non-empty string"),
    ('{"id": "a", "paragraphs": []}', "line 2: 'paragraphs' must not be empty"),
    ('{"id": "a", "paragraphs": ["x", ""]}', r"line 2: paragraphs\[1\] must be a non-empty string"),
    ('{"id": "a", "text": "x", "references": "y"}', "line 2: 'references' must be a list of strings"),
    ('{"id": "z", "text": "x"}', "line 2: duplicate id 'z' \\(first on line 1\\)"),
])
def test_bad_jsonl_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "z", "text": "ok"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=f"c.jsonl: {message}"):
        read_corpus(path)


def test_bad_files(tmp_path):
    with pytest.raises(CorpusError, match="nope.txt: file not found"):
        read_document(tmp_path / "nope.txt")
    (tmp_path / "x.pdf").write_text("x")
    with pytest.raises(CorpusError, match="extension '.pdf'"):
        read_document(tmp_path / "x.pdf")
    (tmp_path / "h.md").write_text("# Only a heading\n\n```\ncode\n```\n")
    with pytest.raises(CorpusError, match=r"h.md: no paragraph to simplify \(2 headings or verbatim blocks only\)"):
        read_document(tmp_path / "h.md")
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\n")
    with pytest.raises(CorpusError, match="bad.txt: line 2: not valid UTF-8"):
        read_document(tmp_path / "bad.txt")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(CorpusError, match="e.jsonl is empty"):
        read_corpus(tmp_path / "e.jsonl")
    (tmp_path / "a.txt").write_text("Text.")
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(CorpusError, match="duplicate document id 'a'"):
        read_documents([tmp_path / "a.txt", tmp_path / "c.jsonl"])


def test_demo_documents():
    files = sorted(p for p in DEMO.iterdir() if p.suffix != ".jsonl")
    assert {p.suffix for p in files} == {".txt", ".md", ".html"}
    docs = read_documents(files)
    assert len(docs) >= 4 and all(len(d.paragraphs) >= 4 for d in docs)
    corpus = read_corpus(DEMO / "corpus.jsonl")
    assert {d.id for d in corpus} == {d.id for d in docs}
    assert sum(1 for d in corpus if d.references) >= 2
    by_id = {d.id: d for d in docs}
    for d in corpus:  # the corpus variant holds the same paragraphs as the formatted files
        assert d.paragraphs == by_id[d.id].paragraphs


def test_txt_heading_lines_are_headings_and_single_newline_text_has_a_paragraph_per_line(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("## Bus fares\n\nFares rise in March.\nThe council\nvoted for it.\n\n# Trains\nTrains stay.\n")
    assert [(b.kind, b.text, b.level, b.line) for b in read_document(blank).blocks] == [
        ("heading", "Bus fares", 2, 1), ("paragraph", "Fares rise in March. The council voted for it.", 0, 3),
        ("heading", "Trains", 1, 7), ("paragraph", "Trains stay.", 0, 8)]
    lines = tmp_path / "chapter.txt"  # a novel chapter, one paragraph per line (the authors' GuoFeng files)
    lines.write_text("He opened the door.\nThe room was dark.\nShe waited.\n")
    assert read_document(lines).paragraphs == ("He opened the door.", "The room was dark.", "She waited.")
    assert read_document(lines, line_paragraphs="never").paragraphs == (
        "He opened the door. The room was dark. She waited.",)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "# Fares\n\nFares rise.\n\nTrains stay."}) + "\n"
                      + json.dumps({"id": "b", "paragraphs": ["## Part", "Text here."]}) + "\n")
    a, b = read_corpus(corpus)
    assert a.paragraphs == ("Fares rise.", "Trains stay.") and a.article.startswith("# Fares\n\nFares rise.")
    assert b.paragraphs == ("Text here.",) and b.blocks[0] == Block("heading", "Part", 2)


def test_a_jsonl_only_directory_is_read_and_an_empty_one_is_refused(tmp_path):
    from core.config import ConfigError
    from jobs.agentsimp.config import InputsConfig

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "a", "text": "Fares rise."}) + "\n")
    inputs = InputsConfig(paths=[str(tmp_path)])
    inputs.validate("inputs")
    assert [d.id for d in read_documents(inputs.files())] == ["a"]
    # the references file is not read twice as input
    assert InputsConfig(paths=[str(tmp_path)], references_path=str(tmp_path / "c.jsonl")).files() == []
    with pytest.raises(ConfigError, match=r"inputs.paths.0: directory .* holds no .* file besides"):
        InputsConfig(paths=[str(tmp_path)], references_path=str(tmp_path / "c.jsonl")).validate("inputs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"inputs.paths.0: directory .*empty holds no \.htm, \.html"):
        InputsConfig(paths=[str(tmp_path / "empty")]).validate("inputs")
    with pytest.raises(CorpusError, match="no document in"):
        read_documents([])
