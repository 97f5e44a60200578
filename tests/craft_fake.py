"""A scripted CRAFT planner + reviser for tests: requests carrying the brief planner's system prompt are answered
from the planner queue, every other request (reviser, Direct, Iter) from the reviser queue; every request is
recorded in `seen` as (messages, sampling)."""

from __future__ import annotations

from types import SimpleNamespace


class Script:
    def __init__(self, planner, reviser):
        self.planner, self.reviser, self.seen = list(planner), list(reviser), []

    def __call__(self, batch):
        out = []
        for messages, sampling in batch:
            self.seen.append((messages, sampling))
            is_planner = messages[0]["role"] == "system" and "tools that check" in messages[0]["content"]
            queue = self.planner if is_planner else self.reviser
            out.append(SimpleNamespace(text=queue.pop(0), finish_reason="stop"))
        return out
