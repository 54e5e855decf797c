"""The runtime process: owns the JAX devices and runs device commands one at a time.

Everything in this package runs inside that process (``python -m app.runtime``), never in
the HTTP process, and imports nothing of the HTTP side. The HTTP process reaches it through
:class:`app.workers.runtime_client.RuntimeClient` and the framing of :mod:`app.core.channel`.

- :mod:`app.runtime.__main__`: the entry point (arguments, environment, start-up).
- :mod:`app.runtime.server`: the command registry and the serve loop.
- :mod:`app.runtime.environment`: the process's environment and settings (light: the HTTP
  process imports it to spawn the runtime).
- :mod:`app.runtime.devices`: ``ping``, ``devices``, ``mesh_grid``; memory budgets.
- :mod:`app.runtime.sessions`: training sessions (create, info, delete).
- :mod:`app.runtime.steps`: their training steps, compiled and admitted.
- :mod:`app.runtime.admission`: memory admission of sessions and steps.
- :mod:`app.runtime.compile_cache`: JAX's persistent cache and the compiled-step cache.
- :mod:`app.runtime.group`: the multi-host command fan-out.

Importing this package imports nothing: JAX must not load before
:func:`app.runtime.environment.runtime_environment` has set ``XLA_FLAGS``.
"""
