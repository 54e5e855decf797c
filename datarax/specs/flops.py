"""FLOPs of a model's parts, per token: one layer's projections, attention's ``QK^T``
and ``AV``, and what a remat policy recomputes in the backward pass. Facts of the model
alone (no mesh, no hardware): the step-time model prices them and the parallelism kinds'
terms read them (a recomputed projection or attention repeats its collectives).

Plain arithmetic, no NumPy and no JAX.
"""

from __future__ import annotations

from datarax.specs.model_specs import ModelSpec, TransformerSpec

__all__ = ["attention_forward_flops", "layer_matmul_flops", "recompute_flops_per_token"]


def layer_matmul_flops(model: TransformerSpec) -> dict[str, float]:
    """Forward FLOPs per token of one layer's projections, by MaxText tensor name."""
    d, f = model.d_model, model.ffn_width
    qk, v = model.qk_head_dim, model.value_head_dim
    return {
        "query_proj": 2.0 * d * model.heads * qk,
        "key_proj": 2.0 * d * model.kv_heads * qk,
        "value_proj": 2.0 * d * model.kv_heads * v,
        "out_proj": 2.0 * model.heads * v * d,
        "mlpwi": 0.0 if model.mlp == "gated" else 2.0 * d * f,
        "mlpwi_0": 2.0 * d * f if model.mlp == "gated" else 0.0,
        "mlpwi_1": 2.0 * d * f if model.mlp == "gated" else 0.0,
        "mlpwo": 2.0 * f * d,
    }


def attention_forward_flops(model: TransformerSpec) -> float:
    """Forward FLOPs per token of one layer's ``QK^T`` and ``AV``, non-causal."""
    return 2.0 * model.seq_len * model.heads * (model.qk_head_dim + model.value_head_dim)


def recompute_flops_per_token(model: ModelSpec) -> tuple[float, float]:
    """``(matmul, attention)`` forward FLOPs per token that the backward pass recomputes
    under the model's remat policy.

    A layer's backward pass needs the q/k/v projections (attention's backward), the
    attention output (``context``, the out projection's weight gradient), the residual
    stream after attention (``out_proj`` added to the input: the second norm's input) and
    the MLP's input projections (``mlpwi_*``: the activation's gradient); never the down
    projection's output (``mlpwo``), which only enters the residual sum. What the policy
    does not keep (on the device or offloaded) is recomputed from the layer input: a
    missing projection costs its matmul, a missing ``context`` the attention's forward,
    and whatever a recomputed tensor needs and is not kept is recomputed first.
    ``none`` recomputes nothing; ``full`` every needed forward matmul and the attention.
    """
    if not isinstance(model, TransformerSpec):
        return (2.0 * model.matmul_params(), 0.0) if model.remat == "full" else (0.0, 0.0)
    places = model.remat_places()
    if places is None:
        return 0.0, 0.0

    def kept(name: str) -> bool:
        return places.get(name) in ("device", "offload")

    mm = layer_matmul_flops(model)
    matmul = 0.0
    qkv = ("query_proj", "key_proj", "value_proj")
    need_qkv = [n for n in qkv if not kept(n)]
    attention = 0.0
    if not kept("context"):  # the out projection's weight gradient needs it
        attention = attention_forward_flops(model)
        need_qkv = list(qkv)
    matmul += sum(mm[n] for n in need_qkv)
    if not kept("out_proj"):
        matmul += mm["out_proj"]
    matmul += sum(mm[n] for n in ("mlpwi", "mlpwi_0", "mlpwi_1") if not kept(n))
    return model.layers * matmul, model.layers * attention
