"""The scope table covers every route, tokens are parsed as documented, and Host headers are
read as the allow-list compares them (no server needed: the app is built, never served)."""

from __future__ import annotations

import pytest
from fastapi.routing import iter_route_contexts

from pgqueue.api import ApiSettings, create_app
from pgqueue.api.scopes import MIN_TOKEN_LENGTH, ROUTE_SCOPES, SCOPES, allows, needed
from pgqueue.api.settings import host_name, is_loopback_host
from pgqueue.errors import ConfigurationError

URL = "postgresql://postgres@127.0.0.1:9/none"  # never dialled
LONG = "a" * MIN_TOKEN_LENGTH


def test_every_route_of_the_app_has_its_scope_in_the_table() -> None:
    app = create_app(ApiSettings(database_url=URL))
    names = {getattr(c, "name", None) for c in iter_route_contexts(list(app.routes))}
    missing = sorted(str(n) for n in names - set(ROUTE_SCOPES))
    assert not missing, (
        f"routes without a scope in pgqueue/api/scopes.py ROUTE_SCOPES: {missing}; "
        "decide which scope may call each (a route missing there needs admin)"
    )
    assert set(ROUTE_SCOPES) <= names, "the table names routes the app does not have"


def test_a_route_missing_from_the_table_needs_admin() -> None:
    assert needed("a_route_added_later") == ("admin",)
    assert not allows({"read", "submit", "metrics"}, "a_route_added_later")
    assert allows({"admin"}, "a_route_added_later")


@pytest.mark.parametrize(
    ("route", "may"),
    [
        ("metrics", {"metrics", "read", "admin"}),
        ("list_tasks", {"read", "admin"}),
        ("get_task", {"read", "submit", "admin"}),
        ("submit", {"submit", "admin"}),
        ("cancel_task", {"submit", "admin"}),
        ("discard_many", {"admin"}),
        ("pause_queue", {"admin"}),
        ("openapi", {"read", "admin"}),
        ("healthz", set(SCOPES)),
    ],
)
def test_each_scope_may_call_what_the_table_says(route: str, may: set[str]) -> None:
    assert {s for s in SCOPES if allows({s}, route)} == may


def test_a_plain_token_is_admin_and_a_prefixed_one_has_its_scopes() -> None:
    settings = ApiSettings(
        tokens=frozenset({"b" * 32, f"metrics:{'c' * 32}", f"read+submit:{'d' * 40}"})
    )
    assert settings.token_scopes() == {
        "b" * 32: {"admin"},
        "c" * 32: {"metrics"},
        "d" * 40: {"read", "submit"},
    }
    assert ApiSettings(tokens={LONG: ["read"]}).token_scopes() == {LONG: {"read"}}


def test_an_unknown_scope_is_refused_naming_it_and_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown scope 'write'.*metrics, read"):
        ApiSettings(tokens=frozenset({f"write:{LONG}"}))


def test_a_short_token_is_refused_saying_how_to_make_one_without_showing_it() -> None:
    short = "s3cret-but-short"
    with pytest.raises(ConfigurationError, match="openssl rand -hex 32") as raised:
        ApiSettings(tokens=frozenset({short}))
    assert short not in str(raised.value)
    assert str(MIN_TOKEN_LENGTH) in str(raised.value)


def test_the_same_token_with_two_scopes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGQUEUE_API_TOKENS_FILE", raising=False)
    monkeypatch.setenv("PGQUEUE_API_TOKENS", f"read:{LONG},admin:{LONG}")
    with pytest.raises(ConfigurationError, match="listed twice") as raised:
        ApiSettings.from_env()
    assert LONG not in str(raised.value)


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("127.0.0.1:8000", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("queue.example.com.", "queue.example.com"),
        ("queue.example.com:443", "queue.example.com"),
        ("", None),
        ("evil.example:80:80", None),
        ("[::1", None),
        ("user@evil.example", None),
        ("a b", None),
        ("host:port", None),
    ],
)
def test_a_host_header_is_read_without_its_port_in_lower_case(
    header: str, host: str | None
) -> None:
    assert host_name(header) == host


def test_the_loopback_names_are_localhost_127_slash_8_and_ipv6_one() -> None:
    assert all(map(is_loopback_host, ["localhost", "127.0.0.1", "127.8.9.10", "::1"]))
    assert not any(map(is_loopback_host, ["rebind.test", "10.0.0.1", "0.0.0.0", "::"]))


def test_the_allowed_hosts_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGQUEUE_API_TOKENS", "PGQUEUE_API_TOKENS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGQUEUE_API_ALLOWED_HOSTS", " Queue.Example.com:8000 , [::1], 10.0.0.5")
    settings = ApiSettings.from_env()
    assert settings.allowed_hosts == {"queue.example.com", "::1", "10.0.0.5"}
    check = settings.host_check()
    assert check is not None and check("queue.example.com") and not check("localhost")
    monkeypatch.setenv("PGQUEUE_API_ALLOWED_HOSTS", "*")
    assert ApiSettings.from_env().host_check() is None
    monkeypatch.setenv("PGQUEUE_API_ALLOWED_HOSTS", "https://queue.example.com/")
    with pytest.raises(ConfigurationError, match="PGQUEUE_API_ALLOWED_HOSTS"):
        ApiSettings.from_env()


def test_without_an_allow_list_tokens_accept_any_host_and_no_tokens_only_loopback() -> None:
    assert ApiSettings(tokens=frozenset({LONG})).host_check() is None
    check = ApiSettings().host_check()
    assert check is not None and check("127.0.0.1") and not check("rebind.test")


@pytest.mark.parametrize(("raw", "flag"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_allow_unauthenticated_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, flag: bool
) -> None:
    monkeypatch.setenv("PGQUEUE_API_ALLOW_UNAUTHENTICATED", raw)
    assert ApiSettings.from_env().allow_unauthenticated is flag


def test_allow_unauthenticated_refuses_a_value_it_cannot_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_API_ALLOW_UNAUTHENTICATED", "maybe")
    with pytest.raises(ConfigurationError, match="PGQUEUE_API_ALLOW_UNAUTHENTICATED"):
        ApiSettings.from_env()


def test_the_openapi_document_names_each_operations_scope() -> None:
    document = create_app(ApiSettings(database_url=URL)).openapi()
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert operations and all("x-pgqueue-scope" in op for op in operations)
    assert document["paths"]["/api/v1/tasks"]["post"]["x-pgqueue-scope"] == ["submit"]
    assert (
        "Scope: admin" in document["paths"]["/api/v1/dead-letters/discard"]["post"]["description"]
    )
    guarded = [op for op in operations if op["x-pgqueue-scope"] != ["open"]]
    assert guarded and all("403" in op["responses"] for op in guarded)
