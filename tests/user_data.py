"""The data as users get it: a copy of this checkout with `../shared/data` laid out by `quorum data get` alone, for
running the suite's data-reading tests against it rather than the development copy (which holds more:
`reference-values.md`, a README).

    python -m tests.user_data /tmp/user                  # /tmp/user/quorum, /tmp/user/shared/data
    cd /tmp/user/quorum && python -m pytest -q -n 0 $(python -m tests.user_data --list-tests)

No network: the corpora come from a development copy (`--source`, default ../shared/data), served over HTTP on
127.0.0.1 as a mirror (`quorum data mirror`), and `quorum data get NAME --to DEST/shared/data --registry MIRROR`
fetches, verifies and lays out each downloadable corpus exactly as it does from the original sources. The checkout
copy holds the tracked and untracked-but-not-ignored files (no .venv, no runs); the venv that runs the tests is
the original's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_DATA = REPO.parent / "shared" / "data"
# how a test reads ../shared/data: the conftest fixture, or the path spelled out
READS_DATA = re.compile(r"\bshared_data\b|\"shared\" / \"data\"|\.\./shared/data/")


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """A static HTTP server over `directory` on 127.0.0.1; yields its base URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def lay_out(data_dir: Path, source: Path = DEV_DATA) -> list[str]:
    """`quorum data get` of every downloadable corpus into `data_dir`, from `source` served as a mirror."""
    from core.corpora import load_registry
    from jobs.cli import main as quorum

    names = [c.name for c in load_registry().corpora.values() if c.access == "download"]
    with tempfile.TemporaryDirectory() as tmp, serve(source) as url:
        mirror = Path(tmp) / "mirror.yaml"
        if quorum(["data", "mirror", str(source), "--base-url", url, "--out", str(mirror)]) != 0:
            raise SystemExit(f"user_data: {source} is not a complete, verified copy of the downloadable corpora")
        code = quorum(["data", "get", *names, "--to", str(data_dir), "--registry", str(mirror), "--accept-licence"])
        if code != 0:
            raise SystemExit(f"user_data: quorum data get exited {code}")
    return names


def copy_checkout(dest: Path) -> None:
    """The files a clone plus the work in progress hold: tracked, and untracked but not ignored."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def data_tests() -> list[str]:
    """The test files that read ../shared/data."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if READS_DATA.search(p.read_text(encoding="utf-8")))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.user_data", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", nargs="?", help="DEST/quorum gets the checkout, DEST/shared/data the corpora")
    parser.add_argument("--source", default=str(DEV_DATA), help="the development copy served as the mirror")
    parser.add_argument("--list-tests", action="store_true", help="print the data-reading test files and exit")
    args = parser.parse_args(argv)
    if args.list_tests:
        print(" ".join(data_tests()))
        return 0
    if not args.dest:
        parser.error("DEST is required")
    dest = Path(args.dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        parser.error(f"{dest} is not empty")
    copy_checkout(dest / "quorum")
    names = lay_out(dest / "shared" / "data", Path(args.source))
    print(f"user_data: {', '.join(names)} in {dest / 'shared' / 'data'} (as `quorum data get` lays them out); "
          f"the checkout in {dest / 'quorum'}. Run the data-reading tests there:\n"
          f"  cd {dest / 'quorum'} && {sys.executable} -m pytest -q -n 0 {' '.join(data_tests())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
