"""SQLite storage: the only package that holds a connection or writes SQL.

- :mod:`app.storage.db`: the engine, :class:`~app.storage.db.Store` (the connection, its
  pragmas, storage faults, transactions and group commits);
- :mod:`app.storage.migrations`: every table's schema and every migration;
- one module per table family: :mod:`~app.storage.plans`, :mod:`~app.storage.sessions`,
  :mod:`~app.storage.compile_checks`, and the job tables' (:mod:`~app.storage.jobs` and
  the modules it names).

Style: each table's statements are module-level functions that take the ``Store`` first
and typed values, and answer typed values (``await plans.get_plan(store, plan_id)``); the
async ones run their blocking SQLite work in a worker thread, a ``*_sync`` or ``*_here``
one is for a caller already in one. The ``Store`` methods that take a function over the
raw ``sqlite3.Connection`` (``write``, ``read``, ``execute``, ``write_grouped`` and their
``*_here`` forms) are package-private: only the modules of this package call them
(``tests/test_import_graph.py`` checks that nothing outside does).
"""
