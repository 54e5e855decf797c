"""Estimates for a model on a mesh: model specs and named models
(:mod:`datarax.specs.model_specs`, :mod:`datarax.specs.named_models`), memory per
device (:mod:`datarax.estimate.memory`), step time (:mod:`datarax.estimate.step_time`),
both together (:mod:`datarax.estimate.cost`) and mesh recommendations
(:mod:`datarax.estimate.recommend`). No JAX."""
