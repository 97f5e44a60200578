"""`quorum simplify-doc FILE`: one document through one AgentSimp configuration, in this process (no Ray cluster).

    quorum simplify-doc notice.txt                                  # pl_iterative on the demo's backbone
    quorum simplify-doc leaflet.md --configuration sync_direct --html out.html
    quorum simplify-doc page.html --config configs/agentsimp_cluster.yaml backbone.engine.kind=openai ...

FILE is .txt, .md or .html (eval.agentsimp.docs). The backbone, plan and templates come from CONFIG (default
configs/agentsimp_demo.yaml) plus dotted overrides, exactly as `quorum run` reads them. Prints the original and the
simplified document side by side, then every paragraph's stage versions (cs_draft, cs, ma, ti, ci); `--html OUT`
writes the same as a page. `--cache DIR` keeps completions in a request cache (a second run is free).
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import sys
import textwrap

import pandas as pd

from core.config import ConfigError, load_config
from eval.agentsimp.docs import read_document
from eval.agentsimp.plan import CONFIGURATIONS
from eval.agentsimp.records import document_row
from eval.agentsimp.roles import split_paragraphs

DEFAULT_CONFIG = "configs/agentsimp_demo.yaml"
WIDTH = 60


def build_parser() -> argparse.ArgumentParser:
    head, usage, details = __doc__.split("\n\n", 2)
    parser = argparse.ArgumentParser(prog="quorum simplify-doc", allow_abbrev=False,
                                     description=head.split(": ", 1)[1], epilog=f"examples:\n{usage}\n\n{details}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="the document: .txt, .md or .html")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of CONFIG's keys")
    parser.add_argument("--configuration", default="pl_iterative", choices=list(CONFIGURATIONS),
                        help="the AgentSimp configuration (default pl_iterative)")
    parser.add_argument("--html", default="", metavar="OUT", help="also write the result as an HTML page")
    parser.add_argument("--config", default=DEFAULT_CONFIG, metavar="CONFIG",
                        help=f"the agentsimp config giving backbone, plan and templates (default {DEFAULT_CONFIG})")
    parser.add_argument("--cache", default="", metavar="DIR", help="a request cache (a second run is free)")
    return parser


def parse_args(argv: list[str]) -> dict:
    args = vars(build_parser().parse_intermixed_args(argv))
    words = [args["file"], *args["overrides"]]  # overrides may come before FILE: FILE is the word without "="
    files = [w for w in words if "=" not in w]
    if len(files) != 1:
        raise ConfigError(f"simplify-doc: one FILE only, got {files[0]!r} and {files[1]!r}" if files else
                          "simplify-doc: missing FILE (.txt, .md or .html)")
    args["file"], args["overrides"] = files[0], [w for w in words if "=" in w]
    return args


def simplify_one(cfg, path: str, configuration: str, cache_dir: str = "") -> dict:
    """The run record (eval.agentsimp.run.run_record) of one document under one configuration."""
    from actors.agentsimp_worker import AgentSimpWorker
    from jobs.agentsimp.config import worker_kwargs

    document = read_document(path, line_paragraphs=cfg.inputs.line_paragraphs)
    kwargs = {**worker_kwargs(cfg, cache_dir), "configs": [configuration], "baselines": []}
    out = AgentSimpWorker(**kwargs)(pd.DataFrame([document_row(document)]))
    return {"document": document, "row": out.iloc[0].to_dict(), "record": json.loads(out.iloc[0]["record_json"])}


def side_by_side(left: list[str], right: list[str], width: int = WIDTH) -> str:
    lines = [f"{'ORIGINAL':<{width}} | SIMPLIFIED", f"{'-' * width}-+-{'-' * width}"]
    for a, b in itertools.zip_longest(left, right, fillvalue=""):
        wa, wb = textwrap.wrap(a, width) or [""], textwrap.wrap(b, width) or [""]
        lines += [f"{x:<{width}} | {y}" for x, y in itertools.zip_longest(wa, wb, fillvalue="")]
        lines.append(f"{'':<{width}} |")
    return "\n".join(lines)


def render_text(result: dict) -> str:
    record, row = result["record"], result["row"]
    parts = [(f"{result['document'].id}: {record['label']} ({record['config']}), {row['calls']} LLM calls, "
              f"{row['fallbacks']} fallbacks"), "",
             side_by_side(list(result["document"].paragraphs), split_paragraphs(record["final"])), "",
             "Per-paragraph stages:"]
    for p in record["paragraphs"]:
        parts.append(f"\n== paragraph {p['index'] + 1} ==\n[original] {p['original']}")
        parts += [f"[{stage}] {text}" for stage, text in p["stages"].items()]
    parts.append("\nDocument stages: " + ", ".join(record["stages"]))
    return "\n".join(parts)


def render_html(result: dict) -> str:
    record, doc = result["record"], result["document"]
    esc = html.escape

    def cell(text: str) -> str:
        return "<td>" + "".join(f"<p>{esc(p)}</p>" for p in split_paragraphs(text)) + "</td>"

    stage_rows = "".join(
        f"<tr><td>{p['index'] + 1}</td><td>{esc(p['original'])}</td>"
        + "".join(f"<td><b>{esc(s)}</b>: {esc(t)}</td>" for s, t in p["stages"].items()) + "</tr>"
        for p in record["paragraphs"])
    doc_rows = "".join(f"<tr><td>{esc(s)}</td>{cell(t)}</tr>" for s, t in record["stages"].items())
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(doc.id)}: {esc(record['label'])}</title>"
            "<style>td{vertical-align:top;border:1px solid #ccc;padding:4px}table{border-collapse:collapse}</style>"
            f"</head><body><h1>{esc(doc.id)}: {esc(record['label'])} ({esc(record['config'])})</h1>"
            f"<table><tr><th>Original</th><th>Simplified</th></tr><tr>{cell(doc.text)}{cell(record['final'])}</tr>"
            f"</table><h2>Paragraph stages</h2><table>{stage_rows}</table>"
            f"<h2>Document stages</h2><table>{doc_rows}</table></body></html>\n")


def main(argv: list[str]) -> int:
    from jobs.agentsimp.config import Config

    args = parse_args(argv)
    cfg = load_config(Config, args["config"], args["overrides"])
    result = simplify_one(cfg, args["file"], args["configuration"], args["cache"])
    print(render_text(result))
    if args["html"]:
        tmp = f"{args['html']}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(render_html(result))
        import os

        os.replace(tmp, args["html"])
        print(f"quorum: wrote {args['html']}", file=sys.stderr)
    return 0
