"""Parallelism kinds: the one registry that pricing, sharding, layouts, recommendations,
compile checks and the MaxText mapping read (:mod:`datarax.parallel.kinds`), and how a
mesh's axes take their roles (:mod:`datarax.parallel.axis_roles`). NumPy-free."""
