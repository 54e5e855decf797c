"""Launch configs.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Any, NotRequired, TypedDict


class LaunchConfig(TypedDict):
    """``POST /v1/meshes/{id}/launch``: ``target`` and that target's members (maxtext:
    ``args``, ``env``, ``env_sources``, ``command``; jobset: ``manifest``; slurm:
    ``script``; env: what ``jax.distributed.initialize`` needs per process, listed in
    ``processes`` up to ``process_list_limit`` processes, else given by ``rule``)."""

    target: str
    args: NotRequired[list[str] | None]
    env: NotRequired[dict[str, str] | None]
    env_sources: NotRequired[dict[str, str] | None]
    command: NotRequired[list[str] | None]
    manifest: NotRequired[dict[str, Any] | None]  # a JobSet, as Kubernetes takes it
    script: NotRequired[str | None]
    notes: list[str]
    warnings: NotRequired[list[str]]  # what will not run as it comes out (no image given)
    process_model: NotRequired[str]
    num_processes: NotRequired[int]
    coordinator_address: NotRequired[str | None]
    rule: NotRequired[dict[str, Any]]
    processes: NotRequired[list[dict[str, Any]] | None]
    process_list_limit: NotRequired[int]


__all__ = ["LaunchConfig"]
