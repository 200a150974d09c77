"""Building workflows without a database: which prepared task depends on which, in
what order they come, where a parent's result is received, and what is refused before any
write."""

from __future__ import annotations

from typing import Any

import pytest

import pgqueue
from pgqueue.queries.specs import TaskSpec
from pgqueue.registry import TaskRegistry

ONE = {"$pgqueue": "parent_result"}
MANY = {"$pgqueue": "parent_results"}

tasks = TaskRegistry()


@tasks.task(name="add")
def add(x: int, y: int) -> int:
    return x + y


@tasks.task(name="total")
def total(values: list[int], ctx: pgqueue.TaskContext, scale: int = 1) -> int:
    return sum(values) * scale


@tasks.task(name="ping")
def ping(note: str = "") -> str:
    return note


def build(node: Any) -> tuple[Any, list[TaskSpec], int]:
    return node.build()


def test_a_chain_depends_step_on_step_and_passes_one_result():
    workflow_id, specs, sinks = build(pgqueue.chain(add.s(1, 2), add.s(10), add.s(y=5)))
    a, b, c = specs
    assert [s.depends_on for s in specs] == [(), (a.id,), (b.id,)]
    assert {s.workflow_id for s in specs} == {workflow_id}
    assert sinks == 1
    assert a.payload == {"x": 1, "y": 2}
    assert b.payload == {"x": 10, "y": ONE}  # the first positional parameter left unbound
    assert c.payload == {"x": ONE, "y": 5}


def test_a_group_is_parallel_and_all_of_it_is_the_sink():
    _, specs, sinks = build(pgqueue.group([add.s(i, i) for i in range(3)]))
    assert [s.depends_on for s in specs] == [(), (), ()]
    assert sinks == 3


def test_a_chord_callback_depends_on_the_header_in_order_and_gets_the_list():
    _, specs, sinks = build(pgqueue.chord([add.s(i, i) for i in range(4)], total.s(scale=2)))
    *header, callback = specs
    assert callback.depends_on == tuple(h.id for h in header)
    assert callback.payload == {"values": MANY, "scale": 2}  # the context is not an argument
    assert sinks == 1


def test_a_chord_of_one_and_a_chord_given_a_group_still_give_lists():
    _, specs, _ = build(pgqueue.chord(add.s(1, 1), total.s()))
    assert specs[-1].payload == {"values": MANY}
    _, specs, _ = build(pgqueue.chord(pgqueue.group(add.s(1, 1), add.s(2, 2)), total.s()))
    assert specs[-1].payload == {"values": MANY}
    assert specs[-1].depends_on == (specs[0].id, specs[1].id)


def test_nesting_a_group_with_a_chain_inside_a_chain():
    flow = pgqueue.chain(
        add.s(1, 1),
        pgqueue.group(add.s(10), pgqueue.chain(add.s(20), add.s(1))),
        total.s(),
        ping.s("done"),
    )
    _, specs, sinks = build(flow)
    first, b, c, d, collect, last = specs
    assert b.depends_on == (first.id,) and c.depends_on == (first.id,)
    assert d.depends_on == (c.id,)
    assert collect.depends_on == (b.id, d.id)  # the group's sinks: b, and the inner chain's end
    assert collect.payload == {"values": MANY}
    assert last.depends_on == (collect.id,)
    assert last.payload == {"note": "done"}  # every parameter bound: it receives nothing
    assert sinks == 1


def test_a_group_after_a_group_depends_on_all_of_it():
    flow = pgqueue.chain(pgqueue.group(ping.s(), ping.s()), pgqueue.group(total.s(), total.s()))
    _, specs, sinks = build(flow)
    p1, p2, t1, t2 = specs
    assert t1.depends_on == t2.depends_on == (p1.id, p2.id)
    assert t1.payload == {"values": MANY}
    assert sinks == 2


def test_a_chord_inside_a_chain():
    flow = pgqueue.chain(ping.s(), pgqueue.chord([add.s(1), add.s(2)], total.s()), add.s(3))
    _, specs, _ = build(flow)
    p, m1, m2, cb, after = specs
    assert m1.depends_on == m2.depends_on == (p.id,)
    assert m1.payload == {"x": 1, "y": ONE}
    assert cb.depends_on == (m1.id, m2.id)
    assert after.depends_on == (cb.id,) and after.payload == {"x": 3, "y": ONE}


def test_each_build_is_a_new_workflow_and_the_same_step_twice_is_two_tasks():
    s = add.s(1, 2)
    w1, specs1, _ = build(pgqueue.group(s, s))
    w2, _, _ = build(pgqueue.group(s, s))
    assert w1 != w2 and specs1[0].id != specs1[1].id


def test_a_handler_type_step_gets_no_marker_and_takes_options():
    _, specs, _ = build(
        pgqueue.chain(ping.s(), pgqueue.step("report", {"week": 12}, queue="reports", priority=1))
    )
    assert specs[1].payload == {"week": 12}
    assert specs[1].queue == "reports"


def test_cleanup_steps_run_anyway_in_both_forms():
    _, specs, _ = build(
        pgqueue.chain(
            ping.s(),
            pgqueue.step("tidy", on_parent_failure="run"),
            ping.s("bound").run_anyway(),
            ping.s(),
        )
    )
    assert [s.run_anyway for s in specs] == [False, True, True, False]


def test_function_options_carry_into_the_step():
    _, specs, _ = build(pgqueue.chain(ping.options(queue="q", max_attempts=9).s("x")))
    assert (specs[0].queue, specs[0].max_attempts) == ("q", 9)


def test_a_root_step_must_bind_what_it_would_receive_unless_it_has_a_default():
    with pytest.raises(pgqueue.ValidationError, match="'y' is missing"):
        build(pgqueue.chain(add.s(1), add.s(2)))
    _, specs, _ = build(pgqueue.chain(ping.s(), ping.s()))
    assert specs[0].payload == {} and specs[1].payload == {"note": ONE}


def test_a_cleanup_step_after_one_parent_must_accept_none():
    @TaskRegistry().task(name="tidy")
    def tidy(previous: int | None) -> None:
        return None

    with pytest.raises(pgqueue.ValidationError, match=r"allow None in its annotation"):
        build(pgqueue.chain(ping.s(), add.s(1).run_anyway()))
    _, specs, _ = build(pgqueue.chain(ping.s(), tidy.s().run_anyway()))
    assert specs[1].payload == {"previous": ONE} and specs[1].run_anyway
    # After a group it receives a list (None in it for a parent that did not complete).
    build(pgqueue.chord([ping.s(), ping.s()], total.s().run_anyway()))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: pgqueue.chain(), "empty chain"),
        (lambda: pgqueue.group(), "empty group"),
        (lambda: pgqueue.group(x for x in ()), "empty group"),
        (lambda: pgqueue.chord([], total.s()), "empty group"),
        (lambda: pgqueue.chain(add.s(1, 2), add), "call .s"),
        (lambda: pgqueue.chord([add.s(1, 2)], total), "call .s"),
        (lambda: pgqueue.chord([add.s(1, 2)], None), "not NoneType"),
        (lambda: pgqueue.chord(3, total.s()), "header must be"),
        (lambda: pgqueue.group(add.s(1, 2), "add"), "not str"),
        (lambda: add.s(1, 2, 3), "takes 2 positional"),
        (lambda: add.s(1, x=2), "given twice"),
        (lambda: add.s(1, z=2), "unexpected argument 'z'"),
        (lambda: add.s("1"), "argument 'x' must be integer"),
        (lambda: total.s(ctx=1), "the task's context"),
        (lambda: ping.s(object()), "is not JSON"),
        (lambda: pgqueue.step("t", depends_on=[]), "a workflow sets it"),
        (lambda: pgqueue.step("t", workflow_id=None), "a workflow sets it"),
        (lambda: pgqueue.step("t", idempotency_key="k"), "cannot have one"),
        (lambda: pgqueue.step("t", on_parent_failure="later"), "'cancel' or 'run'"),
        (lambda: pgqueue.step("t", queue=""), "must not be empty"),
        (lambda: pgqueue.step("t", {"a": object()}), "JSON"),
        (lambda: ping.s().set_options(depends_on=[]), "a workflow sets it"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(make, message):
    with pytest.raises(pgqueue.ValidationError) as caught:
        make()
    assert message in str(caught.value)
