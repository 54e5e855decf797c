"""JAX at work: collectives over pytrees, sharded train steps, the training step compiled
from abstract shapes for any mesh, and the multi-process runtime with its global arrays."""
