"""Metric reductions without JAX (:mod:`datarax.metrics.reductions` over NumPy kernels),
their JAX overrides (:mod:`datarax.metrics._reduce_kernels`) and the merge of partial stacked
metrics from several hosts (:mod:`datarax.metrics.merge`)."""
