"""Model descriptions: the shapes, dtypes and parameter groups of the models the library
plans (:mod:`~datarax.specs.model_specs`), their fields and checks
(:mod:`~datarax.specs.model_fields`) and the named models with their sources
(:mod:`~datarax.specs.named_models`). Plain data, no NumPy and no JAX; below every
package that prices, shards or builds a model."""
