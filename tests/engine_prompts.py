"""User prompts of mixed lengths (2 to ~25 tokens) the hf engine's tests send (tests/test_hf_engine.py,
tests/test_shared_prefix.py)."""

PROMPTS = [
    "Simplify: The committee postponed its decision.",
    "Rewrite in plain words: Notwithstanding the reservations expressed by several members, the proposal passed.",
    "Hi",
    "Explain photosynthesis to a child in one sentence, avoiding technical vocabulary where possible.",
    "Make this shorter: owing to unprecedented demand the manufacturer implemented an allocation system.",
    "Why?",
]
