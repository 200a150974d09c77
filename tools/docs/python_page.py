"""The Python reference: every name of ``pgqueue.__all__``, documented from its docstring by
mkdocstrings, grouped by what it is for. The page holds only ``::: path`` directives; the
text comes from the code when the site is built.

The names are read from the package (``__all__`` and where each lives), so a new public name
lands on the page by itself, in the group of its module.
"""

from __future__ import annotations

# The groups, in page order: a title, a sentence, and the modules whose public names it holds.
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Task types and handlers",
        "Declaring what a task is, and what a handler gets and may raise.",
        ("pgqueue.registry", "pgqueue.function_tasks", "pgqueue.executor", "pgqueue.hooks"),
    ),
    (
        "Submitting, reading and managing tasks",
        "The operations take your connection (psycopg, or a SQLAlchemy session) and never "
        "commit: they join your transaction. `pgqueue.aio` has the same names as coroutines.",
        ("pgqueue.operations", "pgqueue.enqueue", "pgqueue.arguments"),
    ),
    (
        "Results and the default client",
        "Asking for a task's result, and submitting without a connection of your own.",
        ("pgqueue.handle", "pgqueue.client", "pgqueue.defaults"),
    ),
    ("Workflows", "Chains, groups and chords.", ("pgqueue.workflows",)),
    ("Schedules", "Periodic tasks.", ("pgqueue.cron",)),
    ("The worker", "Running handlers inside your own process.", ("pgqueue.worker",)),
    ("Data", "What the operations return.", ("pgqueue.models",)),
    ("Errors", "Everything pgqueue raises derives from `PgQueueError`.", ("pgqueue.errors",)),
)

INTRO = """\
# Python API

Everything `import pgqueue` offers (its `__all__`), generated from the docstrings. Importing
`pgqueue` loads only its `__init__`: each name is imported from its module the first time it is
used. Link to a name as `reference/python.md#pgqueue.NAME`.
"""

OPTIONS = """\
    options:
      heading_level: 3
      show_root_heading: true
      show_root_full_path: false
"""


# Modules a user imports by name, beyond ``import pgqueue``, each documented with its
# ``__all__`` or, for a module without one, the names listed here.
MODULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "pgqueue.testing",
        "Testing code that uses pgqueue: an in-process worker, a call with a "
        "real `TaskContext`, eager mode. See [Testing your tasks](../testing.md).",
        (),
    ),
    (
        "pgqueue.contrib.celery",
        "Moving from Celery: tasks moved one at a time, Celery's "
        "messages forwarded. See [Coming from Celery](../from-celery.md).",
        (
            "moved",
            "MovedTask",
            "MovedResult",
            "forward",
            "ForwardReport",
            "destinations",
            "Destination",
            "CeleryMessage",
            "Unforwardable",
        ),
    ),
)

MODULE_OPTIONS = """\
    options:
      heading_level: 3
      show_root_heading: true
      show_root_full_path: true
      members_order: source
"""


def homes() -> dict[str, str]:
    """Each public name -> the module it lives in (as ``pgqueue.__getattr__`` finds it)."""
    import pgqueue

    return {name: pgqueue._HOME_OF[name] for name in pgqueue.__all__ if name != "__version__"}


def async_names() -> list[str]:
    import inspect

    import pgqueue.aio

    return sorted(
        n
        for n, v in vars(pgqueue.aio).items()
        if not n.startswith("_") and inspect.iscoroutinefunction(v)
    )


def _entry(name: str, home: str) -> list[str]:
    """The directive for ``pgqueue.NAME``, whose anchor is ``#pgqueue.NAME``. A name that is also
    a submodule's (``pgqueue.enqueue``, the function, and ``pgqueue/enqueue.py``) is documented
    from its home, and given its ``pgqueue.NAME`` anchor by hand."""
    import importlib.util

    if importlib.util.find_spec(f"pgqueue.{name}") is None:
        return [f"::: pgqueue.{name}", OPTIONS]
    return [f'<a id="pgqueue.{name}"></a>', "", f"::: {home}.{name}", OPTIONS]


def render() -> str:
    """The page's Markdown."""
    where = homes()
    grouped = {m for _, _, modules in GROUPS for m in modules}
    missing = sorted({m for m in where.values()} - grouped)
    if missing:
        raise ValueError(f"tools/docs/python_page.py GROUPS: no group for {missing}")
    out = [INTRO]
    for title, about, modules in GROUPS:
        out += [f"## {title}", "", about, ""]
        for name in sorted(n for n, m in where.items() if m in modules):
            out += _entry(name, where[name])
    aio = ", ".join(f"`{n}`" for n in async_names())
    out += [
        "## Async: `pgqueue.aio`",
        "",
        "The same operations for async code: pass a psycopg `AsyncConnection` or a SQLAlchemy "
        "`AsyncSession`, and await them. Each is the async twin of the operation of the same "
        "name above, with the same arguments and results.",
        "",
        aio + ".",
        "",
        "## Beyond `import pgqueue`",
        "",
    ]
    for module, about, members in MODULES:
        listed = f"      members: [{', '.join(members)}]\n" if members else ""
        out += [about, "", f"::: {module}", MODULE_OPTIONS + listed]
    return "\n".join(out)
