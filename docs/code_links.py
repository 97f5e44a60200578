"""mkdocs hook: links from a page to the repository's source (`[eval/craft/](../../eval/craft/)`).

On the repository host such a relative link opens the folder or file as it is. In the built site the source is not
part of the site, so the link goes to the repository (`repo_url` in mkdocs.yml) when one is set, and otherwise stays
as the code text alone rather than a link that leads nowhere (`mkdocs build --strict` refuses those). A link to a
path that does not exist in the checkout is an error either way.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# [text](target) where target climbs out of docs/ (../ as many times as the page is deep, then a repository path)
LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+)([^)#\s]*)\)")


class CodeLinkError(RuntimeError):
    pass


def source_path(page_path: str, ups: str, rest: str) -> str | None:
    """The repository path a relative link from docs page `page_path` points at, or None if it stays in docs/."""
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_path), ups + rest))
    return None if joined == "docs" or joined.startswith("docs/") else joined


def rewrite(markdown: str, page_path: str, repo_url: str | None) -> str:
    def one(match: re.Match) -> str:
        text, ups, rest = match.groups()
        target = source_path(page_path, ups, rest)
        if target is None:
            return match.group(0)
        if target.startswith("..") or not (ROOT / target).exists():
            raise CodeLinkError(f"docs/{page_path}: link to {target!r}, which is not in the repository")
        if not repo_url:
            return text
        kind = "tree" if (ROOT / target).is_dir() else "blob"
        return f"[{text}]({repo_url.rstrip('/')}/{kind}/HEAD/{target.rstrip('/')})"

    return LINK.sub(one, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return rewrite(markdown, page.file.src_uri, config.get("repo_url"))
