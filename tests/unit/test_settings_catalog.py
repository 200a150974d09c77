"""The settings table (pgqueue/settings_catalog.py) is the whole truth about the environment:
every PGQUEUE_* variable the package's source names is in it (or listed as no setting, with
why), every row names a variable the source reads, and every command line option that falls
back to a variable is listed as that variable's flag."""

from __future__ import annotations

import re
from pathlib import Path

from pgqueue.settings_catalog import NOT_SETTINGS, SETTINGS
from tools.docs import cli_page

PACKAGE = Path(__file__).resolve().parents[2] / "pgqueue"
CATALOG = PACKAGE / "settings_catalog.py"
NAME = re.compile(r"\bPGQUEUE_[A-Z0-9_]*[A-Z0-9]\b")


def _names_in_source() -> dict[str, set[str]]:
    """Each PGQUEUE_* name -> the files (outside the catalogue) that spell it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*"):
        if path == CATALOG or path.suffix not in {".py", ".sql", ".js", ".html"}:
            continue
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_variable_the_package_names_is_in_the_table() -> None:
    listed = {s.env for s in SETTINGS} | set(NOT_SETTINGS)
    missing = {n: sorted(f) for n, f in _names_in_source().items() if n not in listed}
    assert not missing, (
        f"PGQUEUE_* names in the source but not in pgqueue/settings_catalog.py: {missing}; "
        "add a Setting (or, for a name that is no setting, a line in NOT_SETTINGS saying why)"
    )


def test_every_row_of_the_table_is_read_somewhere() -> None:
    source = _names_in_source()
    unread = [s.env for s in SETTINGS if s.env not in source]
    stale = [n for n in NOT_SETTINGS if n not in source]
    assert not unread, f"settings nothing in pgqueue/ reads any more: {unread}"
    assert not stale, f"NOT_SETTINGS names nothing in pgqueue/ spells any more: {stale}"


def test_each_variable_is_listed_once_with_a_description() -> None:
    names = [s.env for s in SETTINGS]
    assert len(names) == len(set(names))
    assert not set(names) & set(NOT_SETTINGS)
    for s in SETTINGS:
        assert s.description.endswith("."), s.env
        assert s.default and s.reader, s.env


def _options_with_a_variable() -> dict[str, set[str]]:
    """PGQUEUE_* variable -> the options (``pgqueue worker --pooler``) that fall back to it."""
    found: dict[str, set[str]] = {}
    for path, command, _ctx in cli_page.commands():
        for param in command.params:
            envvars = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
            for env in envvars:
                if env and env.startswith("PGQUEUE_"):
                    flag = max(param.opts, key=len)
                    found.setdefault(env, set()).add(" ".join(("pgqueue", *path, flag)))
    return found


def test_the_flags_of_each_setting_are_the_options_that_read_it() -> None:
    from_cli = _options_with_a_variable()
    assert from_cli, "no option falls back to a PGQUEUE_* variable: the walk found nothing"
    for env, flags in from_cli.items():
        listed = next(s.flags for s in SETTINGS if s.env == env)
        assert flags <= set(listed), f"{env}: the table's flags {listed} lack {flags}"


def test_every_flag_in_the_table_is_an_option_of_that_command() -> None:
    options = {
        " ".join(("pgqueue", *path, opt))
        for path, command, _ctx in cli_page.commands()
        for param in command.params
        for opt in param.opts
    }
    for s in SETTINGS:
        for flag in s.flags:
            assert flag in options, f"{s.env}: {flag!r} is no option of pgqueue"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def test_the_numeric_defaults_are_the_codes() -> None:
    from pgqueue import config, embedded
    from pgqueue.api import settings as api

    expected: dict[str, float] = {
        "PGQUEUE_MAX_PAYLOAD_BYTES": config.DEFAULT_MAX_PAYLOAD_BYTES,
        "PGQUEUE_MAX_RESULT_BYTES": config.DEFAULT_MAX_RESULT_BYTES,
        "PGQUEUE_MAX_SNOOZES": config.DEFAULT_MAX_SNOOZES,
        "PGQUEUE_SNAPSHOT_WARN_SECONDS": config.DEFAULT_SNAPSHOT_WARN_SECONDS,
        "PGQUEUE_EMBEDDED_PG_VERSION": embedded.DEFAULT_VERSION,
        "PGQUEUE_API_MAX_WAITERS": api.DEFAULT_MAX_WAITERS,
        "PGQUEUE_API_WAIT_POLL_SECONDS": api.DEFAULT_WAIT_POLL,
        "PGQUEUE_API_BODY_TIMEOUT": api.DEFAULT_BODY_TIMEOUT,
    }
    # An option that falls back to a variable has its default in the command itself.
    for _path, command, _ctx in cli_page.commands():
        for param in command.params:
            env = param.envvar if isinstance(param.envvar, str) else None
            if (
                env
                and isinstance(param.default, int | float)
                and not isinstance(param.default, bool)
            ):
                expected[env] = param.default
    numeric = {s.env: _number(s.default) for s in SETTINGS if _number(s.default) is not None}
    assert set(numeric) <= set(expected), sorted(set(numeric) - set(expected))
    for env, value in numeric.items():
        assert value == expected[env], f"{env}: the table says {value}, the code {expected[env]}"
