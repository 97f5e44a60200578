"""Request cache: a completion stored under a hash of (model, rendered prompt, sampling params, seed).

A re-run, or another job that asks the same judge the same thing, reads the stored completion instead of
recomputing it. Entries are one small JSON file each under `<run.root>/_cache/requests/<k[:2]>/<k>.json`, written
to a temp name and renamed, so concurrent actors (or nodes sharing an object store root) never read half an entry.
Failed completions (finish_reason == "error") are never cached: a retry must really retry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid

import pyarrow.fs as pafs

from actors.engines.base import ChatRequest, Completion


def request_key(model_identity: str, request: ChatRequest) -> str:
    """Content hash of everything that determines the completion."""
    blob = json.dumps(
        {"model": model_identity, "messages": request.messages, "sampling": request.sampling.as_dict()},
        sort_keys=True, ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class RequestCache:
    """File-per-entry cache on any pyarrow filesystem (local directory or URI)."""

    def __init__(self, root: str):
        if "://" in root:
            self.fs, self.root = pafs.FileSystem.from_uri(root)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), root
        self.fs.create_dir(self.root, recursive=True)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}.json"

    def get(self, key: str) -> Completion | None:
        try:
            with self.fs.open_input_stream(self._path(key)) as f:
                return Completion(**json.loads(f.read().decode()))
        except (FileNotFoundError, OSError):
            return None
        except (ValueError, TypeError):
            # a corrupt or older-format entry is a miss, not a crash; it gets overwritten
            return None

    def put(self, key: str, completion: Completion) -> None:
        if completion.finish_reason == "error":
            return
        path = self._path(key)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self.fs.create_dir(f"{self.root}/{key[:2]}", recursive=True)
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(dataclasses.asdict(completion), ensure_ascii=False).encode())
        self.fs.move(tmp, path)
