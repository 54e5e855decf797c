"""Job metric history, no HTTP here: :mod:`~app.services.jobs.decode` (a pushed body ->
one batch), :mod:`~app.services.jobs.rows` (-> the rows to store),
:mod:`~app.services.jobs.push`, :mod:`~app.services.jobs.history` (pages and buckets),
:mod:`~app.services.jobs.summaries` (the jobs list, finish, delete, gauges) and
:mod:`~app.services.jobs.retention`. The SQL is :mod:`app.storage.jobs` and its siblings."""
