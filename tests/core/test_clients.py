"""[[clients]] (issue 24): each bad table refused with a clear error naming it; keys matched
by digest against every client; the model allow-list."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from meshroute_middleware.core.clients import (
    Client,
    ClientConfigError,
    ClientTable,
    ModelNotAllowedError,
    check_distinct,
    check_model,
    check_pin,
    find_client,
    key_digest,
    may_use,
    parse_clients,
)

HEX = "ab" * 32
GOOD: dict[str, Any] = {"name": "alice-laptop", "key": "env:ALICE_KEY",
                        "models": ["auto", "qwen", "fastco/*"], "rpm": 60, "tpm": 200000,
                        "daily_tokens": 2000000, "monthly_usd": 5.0}


def test_the_contract_table_parses_into_its_fields() -> None:
    (table,) = parse_clients([GOOD])
    assert table == ClientTable("alice-laptop", "env:ALICE_KEY", ("auto", "qwen", "fastco/*"),
                                60, 200000, 2000000, 5.0)
    client = table.client("a-key-of-16-chars-or-more")
    assert client.key_digest == hashlib.sha256(b"a-key-of-16-chars-or-more").digest()
    assert (client.name, client.models, client.rpm, client.tpm, client.daily_tokens,
            client.monthly_usd) == ("alice-laptop", ("auto", "qwen", "fastco/*"), 60, 200000,
                                    2000000, 5.0)


def test_optional_fields_default_to_everything_and_unlimited() -> None:
    (table,) = parse_clients([{"name": "ci", "key": f"sha256:{HEX.upper()}"}])
    client = table.client()
    assert client == Client("ci", bytes.fromhex(HEX))
    assert parse_clients([{"name": "f", "key": "file:~/k"}])[0].key == "file:~/k"
    assert parse_clients([{"name": "z", "key": "env:K", "monthly_usd": 0}])[0].monthly_usd == 0


@pytest.mark.parametrize(("tables", "says"), [
    ({"name": "a"}, "array of tables"),
    (["x"], "[[clients]] #1 must be a table"),
    ([{"key": "env:K"}], "#1: name must be a string matching [a-z0-9-]+"),
    ([{"name": "Alice", "key": "env:K"}], "#1: name must be"),
    ([{"name": "a_b", "key": "env:K"}], "#1: name must be"),
    ([{"name": "a" * 65, "key": "env:K"}], "at most 64"),
    ([{"name": "a", "key": "env:K"}, {"name": "a", "key": "env:L"}],
     "'a': the name is configured twice"),
    ([{"name": "a", "key": "env:K"}, {"name": "b", "key": "env:K"}], "another client's"),
    ([{"name": "a"}], "'a': key must be 'env:NAME', 'file:PATH' or 'sha256:"),
    ([{"name": "a", "key": "mr-literal-key-pasted-here"}], "'a': key must be"),
    ([{"name": "a", "key": "sha256:abcd"}], "'a': key must be"),
    ([{"name": "a", "key": "env:"}], "'a': key must be"),
    ([{"name": "a", "key": "file:"}], "'a': key must be"),
    ([{"name": "a", "key": "env:K", "model": ["x"]}], "'a': unknown key(s) model"),
    ([{"name": "a", "key": "env:K", "models": []}], "'a': models must be a non-empty list"),
    ([{"name": "a", "key": "env:K", "models": "auto"}], "'a': models must be"),
    ([{"name": "a", "key": "env:K", "models": ["auto", 3]}], "'a': models must be"),
    ([{"name": "a", "key": "env:K", "rpm": 0}], "'a': rpm must be a positive integer"),
    ([{"name": "a", "key": "env:K", "tpm": 1.5}], "'a': tpm must be a positive integer"),
    ([{"name": "a", "key": "env:K", "daily_tokens": True}], "'a': daily_tokens must be"),
    ([{"name": "a", "key": "env:K", "monthly_usd": -1}], "'a': monthly_usd must be"),
    ([{"name": "a", "key": "env:K", "monthly_usd": float("nan")}], "'a': monthly_usd"),
    ([{"name": "a", "key": "env:K", "monthly_usd": "5"}], "'a': monthly_usd"),
])
def test_each_bad_table_is_a_clear_error_naming_it(tables: object, says: str) -> None:
    with pytest.raises(ClientConfigError) as err:
        parse_clients(tables)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_pasted_key_is_never_echoed() -> None:
    with pytest.raises(ClientConfigError) as err:
        parse_clients([{"name": "a", "key": "mr-super-secret-value"}])
    assert "super-secret" not in str(err.value)


def test_a_short_resolved_key_is_refused_by_name() -> None:
    (table,) = parse_clients([{"name": "a", "key": "env:K"}])
    with pytest.raises(ClientConfigError, match="'a': env:K: the key is shorter than 16"):
        table.client("short")


def test_two_clients_with_one_key_are_refused() -> None:
    same = key_digest("k" * 20)
    with pytest.raises(ClientConfigError, match="'b': its key is 'a''s too"):
        check_distinct([Client("a", same), Client("b", same)])


def test_find_client_matches_the_digest_of_the_presented_key() -> None:
    a, b = Client("a", key_digest("key-of-a-0123456789")), Client("b", key_digest("key-b" * 4))
    assert find_client((a, b), b"key-of-a-0123456789") is a
    assert find_client((a, b), b"key-b" * 4) is b
    assert find_client((a, b), b"key-of-a-012345678") is None
    assert find_client((), b"anything") is None


@pytest.mark.parametrize(("patterns", "model", "allowed"), [
    ((), "anything/at-all", True),
    (("auto",), "auto", True),
    (("auto",), "auto:coding", False),
    (("auto", "auto:*"), "auto:coding", True),
    (("fastco/*",), "fastco/big-model", True),
    (("fastco/*",), "slowco/small-model", False),
    (("qwen",), "Qwen", False),  # case matters: model names are exact
    (("qwen",), "qwen-7b", False),
    (("qwen*",), "qwen-7b", True),
])
def test_the_allow_list_matches_the_name_asked_for(patterns: tuple[str, ...], model: str,
                                                   allowed: bool) -> None:
    client = Client("c", b"d", patterns)
    assert may_use(client, model) is allowed
    if allowed:
        check_model(client, model)
    else:
        with pytest.raises(ModelNotAllowedError, match=f"'c' may not use model {model!r}"):
            check_model(client, model)


def test_no_client_may_use_everything() -> None:
    assert may_use(None, "fastco/big-model")
    check_model(None, "auto")
    check_pin(None, ["fastco/big-model"])


@pytest.mark.parametrize(("patterns", "pin", "allowed"), [
    (("auto",), ["fastco/big-model"], False),  # allowed `auto`: not a way to any route
    (("auto", "fastco/*"), ["fastco/big-model"], True),
    (("auto", "qwen"), ["qwen"], True),  # a chain's mesh entry, by its model name
    (("auto",), ["qwen"], False),
    ((), ["fastco/big-model"], True),  # no allow-list: everything
])
def test_a_pin_is_judged_as_the_name_it_pins(patterns: tuple[str, ...], pin: list[str],
                                             allowed: bool) -> None:
    client = Client("c", b"d", patterns)
    if allowed:
        check_pin(client, pin)
    else:
        with pytest.raises(ModelNotAllowedError, match=f"may not use model {pin[0]!r}"):
            check_pin(client, pin)


def test_find_client_compares_every_digest_whichever_matches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import meshroute_middleware.core.clients as module

    compared: list[bytes] = []
    real = module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(module.hmac, "compare_digest", counting)
    clients = tuple(Client(f"c{i}", key_digest(f"key-number-{i:04d}-of-ten")) for i in range(10))
    assert find_client(clients, b"key-number-0000-of-ten") is clients[0]  # the first matches
    assert compared == [c.key_digest for c in clients]  # and all ten were compared, in order
    compared.clear()
    assert find_client(clients, b"no-such-key") is None
    assert len(compared) == 10
