"""The nearest-name suggestion every "unknown name" message shares (issue 40)."""

from __future__ import annotations

from datarax.names import did_you_mean, nearest


def test_the_nearest_valid_name_is_suggested_or_nothing():
    assert did_you_mean("fsdb", ["data", "fsdp", "tensor"]) == " (did you mean 'fsdp'?)"
    assert did_you_mean("TPU-V5E", ["tpu-v5e", "tpu-v5p"]) == " (did you mean 'tpu-v5e'?)"
    assert did_you_mean("qqqq", ["data", "fsdp"]) == ""
    assert nearest(7, ["data"]) is None and nearest("batch_shap", ["batch_shape"]) == "batch_shape"
