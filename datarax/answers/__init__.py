"""The service's answers as types, each defined once: frozen dataclasses
(:class:`~datarax.answers.base.Answer`) that the library builds, the service serialises and
documents (its OpenAPI schemas come from these classes) and the client parses back.

JAX-free, pydantic-free: the client imports these modules and nothing else of the
library but :mod:`datarax.npz` and :mod:`datarax.json_types`.
"""
