"""A stand-in for the quorum reward service at the world's edge, for the clients' failure cases and for checking what
they send: `/reward/group` and `/score` answer in the service's wire format (tests/test_serve_app.py checks the real
one), every request body is recorded, and `mode` makes it fail the ways a real deployment does.

    with RewardStub() as stub:            # stub.url; stub.requests: [(path, body), ...]
        stub.mode = "503"                 # "ok" | "401" | "503" | "400" | "timeout" | "null"

`ok` grades a response by its length in words (min(5, 1 + words // 3)); a pairwise group's own grade is that grade,
its margin the grade minus the group's mean. `null` answers 200 with null rewards (judgments that did not parse).
Standard library only: the trainer environments run it too (`python tests/reward_stub.py PORT MODE`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

MESSAGES = {"401": "missing or wrong bearer token", "503": "judge engine unavailable: no replica is ready",
            "400": "responses: a group needs at least 2 responses"}


def grade(text: str) -> float:
    return float(min(5, 1 + len(text.split()) // 3))


class RewardStub:
    def __init__(self, mode: str = "ok", port: int = 0, delay_s: float = 30.0):
        self.mode, self.delay_s = mode, delay_s
        self.requests: list[tuple[str, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append((self.path, body))
                status, answer = stub.answer(self.path, body)
                if stub.mode == "timeout":
                    time.sleep(stub.delay_s)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout mode)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        if self.mode in MESSAGES:
            return int(self.mode), {"error": {"message": MESSAGES[self.mode]}}
        null = self.mode == "null"
        if path.startswith("/score"):
            return 200, {"grade": None if null else grade(body["response"]),
                         "parse_status": "no_grade" if null else "ok"}
        if path.startswith("/reward/group"):
            grades = [grade(r) for r in body["responses"]]
            mean = sum(grades) / len(grades)
            items = [{"index": i, "mean_grade": None if null else g, "reward": None if null else g - mean}
                     for i, g in enumerate(grades)]
            return 200, {"scheme": body.get("scheme", "all_pairs"), "rewards": [it["reward"] for it in items],
                         "items": items, "counts": {"n_failed_judgments": len(grades) if null else 0}}
        return 404, {"error": {"message": f"no route {path}"}}

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":  # a stub in a process of its own: python tests/reward_stub.py PORT MODE
    with RewardStub(sys.argv[2], int(sys.argv[1])) as running:
        print(running.url, flush=True)
        threading.Event().wait()
