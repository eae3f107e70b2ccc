"""Key references resolve to Secrets that never print; errors never carry a key."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from meshroute_middleware.chat.keyring import (
    KeyRefError,
    Secret,
    resolve_key,
    resolve_keys,
    scrub,
    scrub_json,
)
from meshroute_middleware.core.providers.config import parse_providers_config

KEY = "sk-test-0123456789abcdef"


def test_a_secret_never_prints(caplog: pytest.LogCaptureFixture) -> None:
    secret = Secret(KEY)
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>40}",
             repr([secret]), repr({"k": secret})]
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("key %s %r", secret, secret)
    shown.append(caplog.text)
    for text in shown:
        assert KEY not in text
    assert secret.reveal() == KEY


def test_a_secret_refuses_to_be_pickled() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(Secret(KEY))


def test_secrets_compare_by_value() -> None:
    assert Secret(KEY) == Secret(KEY) and Secret(KEY) != Secret("other")
    assert len({Secret(KEY), Secret(KEY)}) == 1


def test_env_reference() -> None:
    assert resolve_key("env:FASTCO_KEY_A", {"FASTCO_KEY_A": f" {KEY}\n"}).reveal() == KEY


@pytest.mark.parametrize("environ", [{}, {"FASTCO_KEY_A": ""}, {"FASTCO_KEY_A": "  "}])
def test_an_unset_env_reference_names_the_variable(environ: dict[str, str]) -> None:
    with pytest.raises(KeyRefError, match="FASTCO_KEY_A is not set"):
        resolve_key("env:FASTCO_KEY_A", environ)


def test_file_reference(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(f"\n{KEY}\n\n")
    assert resolve_key(f"file:{path}", {}).reveal() == KEY


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read the key file"), ("", "the key file is empty"),
    (f"{KEY}\nsecond", "more than one line"), ("x" * 70_000, "larger than")])
def test_a_bad_key_file(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KeyRefError, match=message) as info:
        resolve_key(f"file:{path}", {})
    assert KEY not in str(info.value)
    assert info.value.__cause__ is None  # an OSError's text may quote the file: not chained


def test_a_literal_is_refused_without_echo() -> None:
    with pytest.raises(KeyRefError) as info:
        resolve_key(KEY, {})
    assert KEY not in str(info.value)


def test_resolve_keys_in_position_order() -> None:
    cfg = parse_providers_config({"providers": [
        {"name": "fastco", "base_url": "http://127.0.0.1:1/v1",
         "keys": ["env:A", "env:B"], "models": [{"id": "m", "tier": "small"}]}]})
    keys = resolve_keys(cfg, {"A": "key-a", "B": "key-b"})
    assert [k.reveal() for k in keys["fastco"]] == ["key-a", "key-b"]
    with pytest.raises(KeyRefError, match=r"\[\[providers\]\] 'fastco': env:B: the environment"):
        resolve_keys(cfg, {"A": "key-a"})


def test_scrub() -> None:
    secrets = [Secret(KEY), Secret("")]
    assert scrub(f"Bearer {KEY} and {KEY}", secrets) == "Bearer *** and ***"
    doc = {"h": [f"Bearer {KEY}", 3], KEY: None}
    assert scrub_json(doc, secrets) == {"h": ["Bearer ***", 3], "***": None}
