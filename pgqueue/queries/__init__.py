"""The only package that executes SQL, in rooms by concern; import from the room.

Each operation is written once, as a generator that yields steps and receives their replies
(a "sans-IO" op), driven on a sync or an async connection. Each room's statements are in the
file of the same name under ``pgqueue/sql/``, one named statement each, with a line on why.

=================  ===========================================================================
room               what it holds
=================  ===========================================================================
``driver``         the steps (Query, Copy, Listen, AwaitNotify), Op and WaitOp, the drivers,
                   the statements' loader, psycopg's errors made pgqueue's, ``@operation``
``specs``          TaskSpec (a task ready to insert), the defaults, the columns inserts send
``submitting``     task_insert, task_insert_many (COPY, keyed), task_copy_columns
``dependencies``   task_insert_dependent, task_parents, task_children, workflow_get,
                   workflow_cancel
``tasks``          task_get, task_list, task_list_summary, task_cancel; dead letters:
                   task_replay, task_discard,
                   task_dead_count
``claiming``       task_claim, claim_round, limits_probe, lease_starts_mark / _prune,
                   task_sweep_expired, task_expire
``leases``         what a lease holder writes: task_complete, task_fail, task_cancel_leased,
                   task_snooze, task_heartbeat, task_release
``queues``         queue_pause / _resume / _remove / _list / _known, retention, limit_set /
                   _clear / _list, task_promote, task_prune
``schedules``      schedule_run, schedule_list
``task_types``     task_types_declare, task_type_parameters, task_types_list
``stats``          queue_overview, queue_depth, queue_backlog, queue_throughput,
                   throughput_series, task_failures, oldest_snapshot
``waiting``        task_waiter_add / _remove (and the API hub's batched forms), the channels
``maintenance``    schema_version, schema_revision, maintenance_try_lock, analyze_if_stale
=================  ===========================================================================

Nothing is re-exported here: ``from pgqueue.queries import claiming``, then
``claiming.task_claim(...)``, says where a statement lives.
"""
