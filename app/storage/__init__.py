"""The store: the only package that holds a connection or writes SQL.

- :mod:`app.storage.store`: the interface, :class:`~app.storage.store.Store` (what the
  service and the table modules use of a database; the group commit and fault bookkeeping
  every engine shares), :class:`~app.storage.store.Statement` (one statement in each
  engine's words) and :mod:`app.storage.errors` (the interface's own errors);
- one implementation per database, side by side: :mod:`app.storage.db` (SQLite's
  :class:`~app.storage.db.SQLiteStore`: the file, its pragmas, faults and space reserve)
  and :mod:`app.storage.postgres` (:class:`~app.storage.postgres.PostgresStore`: several
  service processes on one database); :func:`app.storage.engines.store_at` picks one;
- each engine's schema: :mod:`app.storage.migrations` (SQLite's tables and every
  migration) and :mod:`app.storage.postgres_schema` (the same tables in PostgreSQL's
  words);
- one module per table family: :mod:`~app.storage.plans`, :mod:`~app.storage.sessions`,
  :mod:`~app.storage.compile_checks`, and the job tables' (:mod:`~app.storage.jobs` and
  the modules it names).

Style: each table's statements are module-level functions that take the ``Store`` first
and typed values, and answer typed values (``await plans.get_plan(store, plan_id)``); the
async ones run their blocking database work in a worker thread, a ``*_sync`` or ``*_here``
one is for a caller already in one. Every statement they run is a ``Statement`` stating
its SQLite and its PostgreSQL text; the engine runs its own. The ``Store`` methods that
take a function over a :class:`~app.storage.store.Connection` (``write``, ``read``,
``execute``, ``write_grouped`` and their ``*_here`` forms) are package-private: only the
modules of this package call them (``tests/test_import_graph.py`` checks that nothing
outside does).
"""
