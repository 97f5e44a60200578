"""Read a W&B offline run file (`run-*.wandb`) so tests can check what a job logged.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of
records, each with a 7-byte header (crc32c, little-endian length, type FULL/FIRST/MIDDLE/LAST) and a payload that
is one serialized `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def iter_payloads(data: bytes):
    if data[:4] != b":W&B":
        raise ValueError("not a W&B run file")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - (pos % BLOCK)
        if left_in_block < 7:
            pos += left_in_block
            continue
        length, rtype = struct.unpack("<HB", data[pos + 4:pos + 7])
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if rtype == FULL:
            yield payload
        elif rtype == FIRST:
            pending = payload
        elif rtype == MIDDLE:
            pending += payload
        elif rtype == LAST:
            yield pending + payload
            pending = b""
        elif rtype == 0 and length == 0:
            break


def read_records(run_file: Path, wait_s: float = 30.0) -> list:
    """The file's records once it holds its `exit` record (what `run.finish()` writes last), or after `wait_s`,
    what it holds then. W&B's service process writes the file: when the job ran in this process, `finish()` can
    return before the last records are on disk (a run's final history step was missing in one suite run)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for payload in iter_payloads(Path(run_file).read_bytes()):
            record = pb.Record()
            record.ParseFromString(payload)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def read_run(run_file: Path) -> dict:
    """{'config': {...}, 'history': [{...}, ...], 'summary': {...}, 'run': {group, entity, tags, name, ...}} from
    one offline run file, once it is complete (`read_records`)."""
    out = {"config": {}, "history": [], "summary": {}}
    for record in read_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out["run"] = {"group": run.run_group, "entity": run.entity, "tags": list(run.tags),
                          "name": run.display_name, "job_type": run.job_type, "project": run.project}
        if kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            for item in updates:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def find_run_files(root: Path) -> list[Path]:
    return sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
