"""Secrets named in configs are masked in every log line; configs only ever hold variable names."""

from __future__ import annotations

import io
import logging

from core.tracking import RedactSecrets, secret_env_names


def test_secret_env_names_come_from_env_keys_only():
    config = {"jury": {"judges": [{"engine": {"api_key_env": "JUDGE_KEY", "model": "x"}}]},
              "serve": {"token_env": "SERVE_TOKEN"}, "other": "NOT_A_NAME"}
    names = secret_env_names(config)
    assert {"JUDGE_KEY", "SERVE_TOKEN", "WANDB_API_KEY"} <= names
    assert "NOT_A_NAME" not in names


def test_redaction_masks_values_in_messages_and_args(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-abcdef123456")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecrets({"JUDGE_KEY"}))
    logger = logging.getLogger("quorum.test.redact")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("header Bearer %s", "sk-abcdef123456")
        logger.info("inline sk-abcdef123456 in text")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "sk-abcdef123456" not in out
    assert out.count("***") == 2


def test_secrets_carry_values_by_pickle_but_show_only_names(monkeypatch):
    import os
    import pickle

    from actors.secrets import Secrets

    monkeypatch.setenv("QUORUM_TEST_SECRET_A", "value-a-7f3e")
    monkeypatch.delenv("QUORUM_TEST_SECRET_B", raising=False)
    secrets = Secrets(["QUORUM_TEST_SECRET_A", "QUORUM_TEST_SECRET_B", ""])
    assert secrets.names == ["QUORUM_TEST_SECRET_A"]  # unset names are not carried
    assert "value-a-7f3e" not in repr(secrets) and "value-a-7f3e" not in str(secrets)
    shipped = pickle.loads(pickle.dumps(secrets))  # as Ray ships an actor's constructor argument
    monkeypatch.delenv("QUORUM_TEST_SECRET_A")
    shipped.install()
    assert os.environ["QUORUM_TEST_SECRET_A"] == "value-a-7f3e"
