"""Arrays in and out of HTTP bodies (JSON and npz), for metrics and training batches alike."""
