"""Named models: the catalog of ``GET /v1/models``, each entry a transformer ``model``
object with its ``source`` and its parameter counts.

The figures (:data:`datarax.specs.named_model_figures.FIGURES`, whose docstring says where
each comes from) are read through :func:`~datarax.specs.model_specs.model_spec` once here
to count each model's parameters: ``total_params`` (every parameter) and
``active_params`` (those a token sees: the routed experts ``experts_per_token`` times, not
``num_experts``; ``total_params`` for a dense model).

Example:
  >>> named_model("llama3.1-8b")["d_ff"]
  14336
  >>> MODELS["mixtral-8x7b"].active_params < MODELS["mixtral-8x7b"].total_params
  True
"""

from __future__ import annotations

from types import MappingProxyType

from datarax.answers.catalog import NamedModelEntry
from datarax.json_types import JSONObject
from datarax.specs.model_specs import TransformerSpec, model_spec
from datarax.specs.named_model_figures import FIGURES, named_model

__all__ = ["MODELS", "models_json", "named_model"]


def _entry(name: str) -> NamedModelEntry:
    spec = model_spec({"name": name})
    assert isinstance(spec, TransformerSpec)
    return NamedModelEntry(
        **FIGURES[name],
        total_params=spec.param_count(),
        active_params=spec.active_param_count(),
    )


MODELS: MappingProxyType[str, NamedModelEntry] = MappingProxyType(
    {name: _entry(name) for name in FIGURES}
)
"""``{name: entry}``: each entry the :class:`~datarax.answers.catalog.NamedModelEntry` answer of
``GET /v1/models/{name}``, a transformer ``model`` object plus ``name``, ``source`` (and
``notes`` where the model has parts this one does not), ``total_params`` and
``active_params``."""


def models_json() -> list[JSONObject]:
    """``GET /v1/models`` items: each entry's JSON (its ``name`` first)."""
    return [entry.to_json() for entry in MODELS.values()]
