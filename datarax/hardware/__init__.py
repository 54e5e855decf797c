"""The accelerator catalog and its topologies: one entry type
(:mod:`datarax.hardware.entry`), the chips with their sources
(:mod:`datarax.hardware.catalog`, looked up through :mod:`datarax.hardware.chips`), JAX's
device order on a pod or cluster (:mod:`datarax.hardware.topology`) and TPU slice shapes
(:mod:`datarax.hardware.tpu_slices`)."""
