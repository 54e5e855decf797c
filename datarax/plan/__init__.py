"""Layout arithmetic without devices (NumPy only): axis resolution and per-device index
ranges (:mod:`datarax.plan.layout`), parameter partition specs
(:mod:`datarax.plan.param_sharding`) and plan and memory sizes (:mod:`datarax.plan.memory`)."""
