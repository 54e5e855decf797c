"""From a plan to a running job: :mod:`datarax.launch.config` over MaxText
(:mod:`datarax.launch.maxtext`, both directions with :mod:`datarax.launch.maxtext_config` and
:mod:`datarax.launch.maxtext_plan_request`), JobSet (:mod:`datarax.launch.k8s`) and SLURM
(:mod:`datarax.launch.slurm`). No JAX."""
