"""Published, measured training runs for calibrating and validating the step-time model.

Every row below was transcribed from a public repository whose exact commit is named in
the row's ``source``.  Nothing here is estimated by us except the fields explicitly called
``derived_*`` (see "Derived figures" below).  Numbers are as the source prints them.

Sources (stored snapshots read with git; commit shas are full 40-hex ids)
------------------------------------------------------------------------
* MaxText (AI-Hypercomputer/maxtext, formerly google/maxtext)
  - TPU v5e table: README.md and v5e_high_performance.md at 9bc243c9 (2023-10-27,
    "Fix performance numbers"); scripts MaxText/configs/largest_job/{16b,32b,64b,128b}.sh
    at that commit (moved unchanged in substance to MaxText/configs/v5e/ at 76bd53b0).
    The table was never re-measured afterwards (identical in README through 2025).
  - TPU v5p table: MaxText/configs/v5p/README.md and scripts
    MaxText/configs/v5p/{32b,64b,128b,256b,512b,1024b}.sh at 76bd53b0 (2023-12-15), the
    commit that first published them.  Later commits changed the scripts (e301755d,
    2024-02-01: 32b pdb 8->7, 256b pdb 2->1, 512b tensor 16->8; later still pdb 6/3/1) but
    NOT the numbers, so the Dec-2023 scripts are the ones recorded.
  - TPU v4 table: README.md at c0e67ec1 (2023-03-08) and MaxText/configs/{1,2,4,8}xv4-128.sh,
    {1,2}xv4-384.sh at that commit.
  - IMPORTANT model family: in 2023 MaxText's ``global_parameter_scale`` models were NOT
    Llama-like.  base.yml then had base_emb_dim 2560, base_num_heads 8 (MHA, kv = q),
    base_mlp_dim 8192, base_num_decoder_layers 16, head_dim 256, mlp_activations ["relu"]
    (plain, ungated), vocab_size 32768, logits_via_embedding True (tied), RoPE, RMSNorm,
    weights float32 / activations bfloat16.  pyconfig.get_individual_scales(scale) then
    doubles (heads & mlp), (emb), (layers) in rotation.  The Llama-style base
    (2048/16/7168/16/128, silu-gated, vocab 32000) only arrived on 2024-02-14 (3b2ac811).
    The v4 (March 2023) model had base_emb_dim 2048, base_num_decoder_layers 16, scale
    multiplied linearly (``scale=3``) and max_target_length 1024.
  - TPU v6e (Trillium) and the v5p Llama-3.1-405B row: AI-Hypercomputer/tpu-recipes
    (commit c8cfe2f6), whose READMEs quote an actual ``completed step: N, seconds: ...``
    log line and the MaxText tuning params; the tuning params were cross-checked against
    benchmarks/maxtext_trillium_model_configs.py at the MaxText tags tpu-recipes-v0.1.2
    (14b5876e) / tpu-recipes-v0.1.4 (9f1820b4) and benchmarks/maxtext_v5p_model_configs.py
    at 3eb77db3.  Model dims from MaxText/configs/models/*.yml at those tags.
* torchtitan (pytorch/torchtitan): benchmarks/llama3_h100_202412_torchtitan.md at
  820504e2 (runs done at torchtitan 9dec370a, 2024-12-26) and docs/performance.md at
  3faaa1a0 (2024-08-23, the 405B bf16 row).  NOTE their "H100" is the 96 GB HBM2e,
  500 W Grand Teton part, not the 80 GB HBM3 700 W H100 SXM5; hardware is recorded as
  "h100-sxm" with that caveat in notes.
* Megatron-LM (NVIDIA/Megatron-LM): README table image images/model_table.png added at
  f2e5db40 (2024-07-15), still current at d98e8a64.  GPT models, vocab 131072, seq 4096.

Measured figures and FLOP conventions
-------------------------------------
``measured`` holds the figure the source prints:
* ``step_s`` (a logged step time), ``tokens_per_s_per_device``,
* ``tflops_per_device`` (model TFLOP/s per chip/GPU by the source's own counting, see
  ``flops_formula``) and ``mfu`` (as a fraction, 0.6110 = 61.10 %), with ``peak_tflops``
  the peak the source divided by when it is evident from the numbers.
Counting conventions (N = all parameters incl. embedding, as MaxText counts them from
the parameter pytree; S = seq len; B = sequences per device per step):
* "maxtext-2023-03": 6*N*S*B per device (no attention term).
* "maxtext-2023-10": 6*N*S*B + 12*H*L*hd*S^2*B (attention counted non-causal).
* "maxtext-2023-12": 6*N*S*B + 6*H*L*hd*S^2*B (attention halved for causality, from
  64ee4e93 2023-11-08 on).
* "maxtext-2025": maxtext_utils.calculate_tflops_training_per_device at the recipe tag:
  matmul FLOPs of ffn+qkv+out projections+logits times 3, plus attention counted
  non-causal (the causal halving returned only in July 2025, after these tags).
* "megatron": megatron/training/training.py num_floating_point_operations at f2e5db40:
  12*Btot*S*L*h^2*((1 + g/a + S/h)*(a*kv/h) + (ffn/h)*glu + V/(2*L*h)), i.e. full
  (non-causal) attention and the logit layer; glu = 1.5 with swiglu else 1.
* torchtitan: tokens/s per GPU, measured (read at iteration 90).

Derived figures
---------------
Where the source gives only TFLOP/s, ``measured["derived_step_s"]`` inverts the source's
own formula above (our arithmetic, from the dims recorded here; exact up to the rounding
of the printed TFLOP/s).  Where it gives tokens/s, ``derived_step_s`` is
global_batch*seq_len/(tokens_per_s_per_device*devices).  Rows with a logged step time
need nothing derived.

Axis mapping
------------
``ici``/``dcn`` use our axis names data/fsdp/tensor.  TPU: ``ici`` inside a slice, ``dcn``
across slices (MaxText default dcn_data_parallelism=-1, i.e. data over slices).  GPU:
``ici`` inside an 8-GPU host (NVLink), ``dcn`` across hosts; for a GPU axis that spans
hosts the within-host part is put in ``ici`` and the rest in ``dcn``.  TPU slice names:
v5e-N / v6e-N count chips (2-D torus); v5p-N and v4-N count TensorCores, chips = N/2.
"""

# ruff: noqa: E501  (data file: long source URLs and notes)
from __future__ import annotations

# --------------------------------------------------------------------------------------
# helpers (pure data builders; no imports)
# --------------------------------------------------------------------------------------

_MT = "github.com/AI-Hypercomputer/maxtext/blob/"
_TR = "github.com/AI-Hypercomputer/tpu-recipes/blob/c8cfe2f689081d36701a101cd73a70965d80926b/"
_TT = "github.com/pytorch/torchtitan/blob/"
_MLM = "github.com/NVIDIA/Megatron-LM/blob/"

C_V4 = "c0e67ec1a66a0583c965a7faf0140e11c41ef7b5"  # 2023-03-08 v4 results
C_V5E = "9bc243c9536bbd80268be23f6374a164fa36efbe"  # 2023-10-27 v5e results
C_V5P = "76bd53b0f44caf989c88189afadeb1062f9254f0"  # 2023-12-15 v5p results
C_TAG012 = "14b5876ea857c09cc3d8645385f984689376a331"  # maxtext tpu-recipes-v0.1.2
C_TAG014 = "9f1820b472ef362e7b5c782fe1d6fda8a0943eff"  # maxtext tpu-recipes-v0.1.4
C_V5P405 = "3eb77db3c94580f56f1b738f8d254b03bd205e35"
C_TT_BENCH = "820504e20d1149fbf0b98c567af24c4b0433b22d"
C_TT_RUN = "9dec370ad26b5f8e9a7333a0e36165018262644b"
C_TT_DOC405 = "3faaa1a0dee68ce028400e3dafd1735d152cb4f8"  # docs/performance.md 2024-08-23
C_MLM = "f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4"

# MaxText custom-remat tensor names; defaults: decoder_layer_input "device", others "remat".
_CUSTOM_KEYS = (
    "decoder_layer_input",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "query_proj",
    "key_proj",
    "value_proj",
    "qkv_proj",
    "out_proj",
)


def _custom(**overrides: str) -> dict:
    d = dict.fromkeys(_CUSTOM_KEYS, "remat")
    d["decoder_layer_input"] = "device"
    d.update(overrides)
    return d


def _scale_2023(scale: int) -> tuple[int, int, int, int]:
    """MaxText get_individual_scales (Sept 2023 on): exponents for emb, heads, mlp, layers."""
    k = scale.bit_length() - 1
    base, rem = divmod(k, 3)
    heads = base + int(rem > 0)
    emb = base + int(rem > 1)
    return emb, heads, heads, base


def _maxtext_2023_model(scale: int, seq: int, remat: str) -> dict:
    """The 2023 MaxText default model (base 2560/8/8192/16, head_dim 256, relu, vocab 32768)."""
    e, h, m, nl = _scale_2023(scale)
    return {
        "kind": "transformer",
        "layers": 16 * 2**nl,
        "d_model": 2560 * 2**e,
        "d_ff": 8192 * 2**m,
        "heads": 8 * 2**h,
        "kv_heads": 8 * 2**h,
        "head_dim": 256,
        "vocab": 32768,
        "seq_len": seq,
        "mlp": "plain",
        "dtype": "bfloat16",
        "param_dtype": "float32",
        "remat": remat,
        "attention": "flash",
        "tied_embeddings": True,
    }


def _llama(
    layers,
    d_model,
    d_ff,
    heads,
    kv_heads,
    vocab,
    seq,
    remat,
    remat_custom=None,
    param_dtype="float32",
    attention="flash",
    tied=False,
    head_dim=128,
    mlp="gated",
):
    m = {
        "kind": "transformer",
        "layers": layers,
        "d_model": d_model,
        "d_ff": d_ff,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": vocab,
        "seq_len": seq,
        "mlp": mlp,
        "dtype": "bfloat16",
        "param_dtype": param_dtype,
        "remat": remat,
        "attention": attention,
        "tied_embeddings": tied,
    }
    if remat_custom is not None:
        m["remat_custom"] = remat_custom
    return m


LLAMA31_8B = {
    "layers": 32,
    "d_model": 4096,
    "d_ff": 14336,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 128256,
}
LLAMA31_70B = {
    "layers": 80,
    "d_model": 8192,
    "d_ff": 28672,
    "heads": 64,
    "kv_heads": 8,
    "vocab": 128256,
}
LLAMA31_405B = {
    "layers": 126,
    "d_model": 16384,
    "d_ff": 53248,
    "heads": 128,
    "kv_heads": 8,
    "vocab": 128256,
}
LLAMA2_70B = {
    "layers": 80,
    "d_model": 8192,
    "d_ff": 28672,
    "heads": 64,
    "kv_heads": 8,
    "vocab": 32000,
}
LLAMA2_13B = {
    "layers": 40,
    "d_model": 5120,
    "d_ff": 13824,
    "heads": 40,
    "kv_heads": 40,
    "vocab": 32000,
}
MISTRAL_7B = {
    "layers": 32,
    "d_model": 4096,
    "d_ff": 14336,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 32000,
}


def _n_params(model: dict) -> int:
    """Parameters as MaxText counts them (embedding + per-layer projections + norms)."""
    e, f, L = model["d_model"], model["d_ff"], model["layers"]
    q = model["heads"] * model["head_dim"]
    kv = model["kv_heads"] * model["head_dim"]
    attn = e * q + 2 * e * kv + q * e
    mlp = (3 if model["mlp"] == "gated" else 2) * e * f
    emb = model["vocab"] * e * (1 if model["tied_embeddings"] else 2)
    return emb + L * (attn + mlp + 2 * e) + e


def _maxtext_flops_per_device(model: dict, pdb: float, convention: str) -> float:
    n = _n_params(model)
    s = model["seq_len"]
    weights = 6.0 * n * s * pdb
    att = 12.0 * model["heads"] * model["layers"] * model["head_dim"] * s * s * pdb
    if convention == "maxtext-2023-03":
        return weights
    if convention == "maxtext-2023-10":
        return weights + att
    if convention == "maxtext-2023-12":
        return weights + att / 2.0
    raise ValueError(convention)


def _megatron_flops(model: dict, global_batch: int) -> float:
    h, L, s, a = model["d_model"], model["layers"], model["seq_len"], model["heads"]
    g = model["kv_heads"]
    qratio = a * model["head_dim"] / h
    glu = 1.5 if model["mlp"] == "gated" else 1.0
    return (
        12.0
        * global_batch
        * s
        * L
        * h
        * h
        * (
            (1 + g / a + s / h) * qratio
            + (model["d_ff"] / h) * glu
            + model["vocab"] / (2.0 * L * h)
        )
    )


def _chips_of(row: dict) -> int:
    if "topology" in row:
        n = 1
        for part in row["topology"].split("x"):
            n *= int(part)
        return n * row.get("slices", 1)
    return row["hosts"] * 8


# --------------------------------------------------------------------------------------
# MaxText TPU v5e (Oct 2023), 16B / 32B / 64B / 128B x 1..32 slices of v5e-256
# --------------------------------------------------------------------------------------

_V5E_TABLE = {
    # scale: (pdb, ici, {slices: (tflops, mfu_percent)})
    16: (
        6,
        {"fsdp": 256},
        {
            1: (120, 61.10),
            2: (117, 59.37),
            4: (117, 59.14),
            8: (115, 58.27),
            16: (111, 56.56),
            32: (108, 54.65),
        },
    ),
    32: (
        4,
        {"fsdp": 256},
        {
            1: (132, 66.86),
            2: (128, 64.81),
            4: (126, 64.10),
            8: (125, 63.67),
            16: (123, 62.26),
            32: (119, 60.40),
        },
    ),
    64: (
        2,
        {"fsdp": 256},
        {
            1: (118, 59.90),
            2: (112, 56.66),
            4: (110, 55.85),
            8: (108, 54.96),
            16: (105, 53.29),
            32: (99, 50.18),
        },
    ),
    128: (
        1,
        {"fsdp": 16, "tensor": 16},
        {
            1: (110, 56.06),
            2: (110, 55.82),
            4: (108, 54.93),
            8: (104, 52.93),
            16: (100, 50.86),
            32: (91, 46.25),
        },
    ),
}

RUNS: list[dict] = []

for _scale, (_pdb, _ici, _byslice) in _V5E_TABLE.items():
    for _sl, (_tf, _mfu) in _byslice.items():
        _m = _maxtext_2023_model(_scale, 2048, "full")
        RUNS.append(
            {
                "id": f"maxtext-v5e-{_scale}b-{_sl}x",
                "hardware": "tpu-v5e",
                "topology": "16x16",
                "slices": _sl,
                "ici": dict(_ici),
                "dcn": {"data": _sl} if _sl > 1 else {},
                "model": _m,
                "global_batch": _pdb * 256 * _sl,
                "per_device_batch": _pdb,
                "measured": {
                    "tflops_per_device": float(_tf),
                    "mfu": round(_mfu / 100.0, 4),
                    "peak_tflops": 197.0,
                    "flops_formula": "maxtext-2023-10",
                },
                "source": (
                    f"{_MT}{C_V5E}/README.md (TPU v5e tables, {_scale}B, {_sl}x v5e-256); "
                    f"config {_MT}{C_V5E}/MaxText/configs/largest_job/{_scale}b.sh; "
                    f"model {_MT}{C_V5E}/MaxText/configs/base.yml + MaxText/pyconfig.py"
                ),
                "notes": (
                    f"global_parameter_scale={_scale} of the 2023 MaxText model (NOT Llama): dims "
                    "computed from base.yml/pyconfig at the commit. per_device_batch_size="
                    f"{_pdb}, remat_policy=full, enable_flash_attention=true, max_target_length=2048, "
                    "synthetic data, reuse_example_batch=1, weights float32 (Flax default at the time). "
                    + (
                        "ici_fsdp=16 ici_tensor=16 set explicitly. "
                        if _scale == 128
                        else "ici_fsdp=-1 (auto=256). "
                    )
                    + "32x row first appears in README at 28816574 (2023-12-08); the 64B 16x MFU is "
                    "53.39% in the Oct-2023 README and 53.29% from Dec 2023 on (105 TFLOP/s both). "
                    "MFU/peak: the TFLOP/s are rounded integers, the MFU carries the precision."
                ),
            }
        )

# --------------------------------------------------------------------------------------
# MaxText TPU v5p (Dec 2023), 32B..1024B, 1x and 2x slices
# --------------------------------------------------------------------------------------

_V5P_TOPO = {
    128: "4x4x4",
    256: "4x4x8",
    512: "4x8x8",
    1024: "8x8x8",
    2048: "8x8x16",
    4096: "8x16x16",
}

_V5P_TABLE = [
    # (scale, v5p-N, pdb, remat, tensor, {slices: (tflops, mfu%)})
    (32, 128, 8, "minimal", 4, {1: (328, 71.47), 2: (319, 69.43)}),
    (64, 128, 4, "minimal", 4, {1: (323, 70.31), 2: (309, 67.26)}),
    (128, 256, 2, "minimal", 8, {1: (315, 68.68), 2: (305, 66.34)}),
    (128, 512, 2, "minimal", 8, {1: (316, 68.83), 2: (274, 59.66)}),
    (256, 1024, 2, "minimal", 8, {1: (308, 67.09), 2: (289, 62.99)}),
    (512, 1024, 2, "full", 16, {1: (294, 63.99), 2: (282, 61.45)}),
    (1024, 2048, 2, "full", 16, {1: (254, 55.35), 2: (237, 51.55)}),
    (1024, 4096, 2, "full", 16, {1: (297, 64.80), 2: (279, 60.83)}),
]

for _scale, _cores, _pdb, _remat, _tp, _byslice in _V5P_TABLE:
    _chips = _cores // 2
    for _sl, (_tf, _mfu) in _byslice.items():
        _m = _maxtext_2023_model(_scale, 2048, _remat)
        _extra = ""
        if _scale == 32 and _sl == 1:
            _extra = (
                "The top-level README later (9501baa1, 2025-01-23, 'v5p-32b flags with SC') "
                "changed this row's MFU to 67.76% but kept 3.28e+02 TFLOP/s; 328/459 = 71.5%, "
                "so the 67.76% is inconsistent with the TFLOP/s figure; kept the Dec-2023 pair. "
            )
        if _scale == 1024 and _cores == 2048 and _sl == 1:
            _extra = (
                "Top-level README (04262f3c and later) prints 2.49e+02 TFLOP/s with 64.05% "
                "MFU for this row, which is self-inconsistent (249/459 = 54%); the configs "
                "README's 254 / 55.35% is recorded. "
            )
        RUNS.append(
            {
                "id": f"maxtext-v5p-{_scale}b-v5p{_cores}-{_sl}x",
                "hardware": "tpu-v5p",
                "topology": _V5P_TOPO[_cores],
                "slices": _sl,
                "ici": {"fsdp": _chips // _tp, "tensor": _tp},
                "dcn": {"data": _sl} if _sl > 1 else {},
                "model": _m,
                "global_batch": _pdb * _chips * _sl,
                "per_device_batch": _pdb,
                "measured": {
                    "tflops_per_device": float(_tf),
                    "mfu": round(_mfu / 100.0, 4),
                    "peak_tflops": 459.0,
                    "flops_formula": "maxtext-2023-12",
                },
                "source": (
                    f"{_MT}{C_V5P}/MaxText/configs/v5p/README.md ({_scale}B model, {_sl}x "
                    f"v5p-{_cores}); config {_MT}{C_V5P}/MaxText/configs/v5p/{_scale}b.sh; model "
                    f"{_MT}{C_V5P}/MaxText/configs/base.yml"
                ),
                "notes": (
                    f"v5p-{_cores} = {_chips} chips (topology is the standard one for that size; the "
                    f"source names only the slice type). global_parameter_scale={_scale} of the 2023 "
                    f"MaxText model (not Llama). per_device_batch_size={_pdb}, remat_policy={_remat}, "
                    f"ici_fsdp=-1 (auto) with ici_tensor={_tp}, attention=flash, seq 2048, int8 off, "
                    "synthetic data. The flops formula is the one in train.py at the publication commit "
                    "(causal attention); the measurement date is not stated. " + _extra
                ),
            }
        )

# --------------------------------------------------------------------------------------
# MaxText TPU v4 (March 2023)
# --------------------------------------------------------------------------------------


def _v4_model(kind: str) -> dict:
    if kind == "22b":  # scale=3 of base 2048/8 heads/8192/16 layers, head_dim 256
        layers, e, heads, ff = 48, 6144, 24, 24576
    else:  # 52B: scale=4 with base_num_decoder_layers=8, base_emb_dim=3072, base_mlp_dim=12288
        layers, e, heads, ff = 32, 12288, 32, 49152
    return {
        "kind": "transformer",
        "layers": layers,
        "d_model": e,
        "d_ff": ff,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": 256,
        "vocab": 32768,
        "seq_len": 1024,
        "mlp": "plain",
        "dtype": "bfloat16",
        "param_dtype": "float32",
        "remat": "full",
        "attention": "dot",
        "tied_embeddings": True,
    }


for _kind, _cores, _topo, _pdb, _byslice in [
    ("22b", 128, "4x4x4", 16, {1: (156, 56.7), 2: (152, 55.2), 4: (149, 54.3), 8: (146, 53.2)}),
    ("52b", 384, "4x4x12", 10, {1: (154, 56.0), 2: (162, 58.9)}),
]:
    _chips = _cores // 2
    for _sl, (_tf, _mfu) in _byslice.items():
        _cfg = f"{_sl}xv4-{_cores}.sh"
        RUNS.append(
            {
                "id": f"maxtext-v4-{_kind}-{_sl}x",
                "hardware": "tpu-v4",
                "topology": _topo,
                "slices": _sl,
                "ici": {"fsdp": _chips},
                "dcn": {"data": _sl} if _sl > 1 else {},
                "model": _v4_model(_kind),
                "global_batch": _pdb * _chips * _sl,
                "per_device_batch": _pdb,
                "measured": {
                    "tflops_per_device": float(_tf),
                    "mfu": round(_mfu / 100.0, 4),
                    "peak_tflops": 275.0,
                    "flops_formula": "maxtext-2023-03",
                },
                "source": f"{_MT}{C_V4}/README.md (TPU v4 tables); config {_MT}{C_V4}/MaxText/configs/{_cfg}",
                "notes": (
                    "March-2023 MaxText model: base 2048 emb / 8 heads / 8192 mlp / 16 layers, head_dim "
                    "256, relu (plain), vocab 32768, tied logits, max_target_length 1024 (base.yml at the "
                    "commit), scaled linearly by 'scale'. Attention was plain dot-product (no flash "
                    "kernel in MaxText then). TFLOP/s counted 6*N*S*B only (no attention term). "
                    + (
                        "v4-384 = 192 chips; 4x4x12 is our assumption of its torus shape. "
                        if _cores == 384
                        else "v4-128 = 64 chips = 4x4x4. "
                    )
                    + (
                        "The 1x script's trailing comment says 165 TFLOP/s while the README table says "
                        "156; the table is recorded. "
                        if (_kind == "22b" and _sl == 1)
                        else ""
                    )
                    + (
                        "README remarks the 2-slice 52B number is oddly higher than 1 slice (compiler "
                        "choice). "
                        if (_kind == "52b" and _sl == 2)
                        else ""
                    )
                    + "Exact topology / slice arrangement of the multi-slice runs is not documented."
                ),
            }
        )

# --------------------------------------------------------------------------------------
# MaxText on TPU v6e (Trillium) and v5p via AI-Hypercomputer/tpu-recipes (logged steps)
# --------------------------------------------------------------------------------------

_V6E_TOPO = {8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


def _recipe(
    id_,
    hw,
    chips_per_slice,
    topo,
    slices,
    ici,
    dcn,
    model,
    global_batch,
    step_s,
    tflops,
    tps,
    log_line,
    path,
    tag,
    cfgname,
    notes,
):
    return {
        "id": id_,
        "hardware": hw,
        "topology": topo,
        "slices": slices,
        "ici": ici,
        "dcn": dcn,
        "model": model,
        "global_batch": global_batch,
        "per_device_batch": global_batch / (chips_per_slice * slices),
        "measured": {
            "step_s": step_s,
            "tflops_per_device": tflops,
            "tokens_per_s_per_device": tps,
            "flops_formula": "maxtext-2025",
            "log_line": log_line,
        },
        "source": (
            f"{_TR}{path} (example log line); tuning params {_MT}{tag}/benchmarks/{cfgname}"
        ),
        "notes": notes,
    }


_C8 = _custom(
    decoder_layer_input="offload",
    out_proj="offload",
    query_proj="offload",
    key_proj="offload",
    value_proj="offload",
)
_C70 = _custom(
    decoder_layer_input="offload", query_proj="offload", key_proj="offload", value_proj="offload"
)

for _chips, _pdb, _cfg, _step, _tf, _tps, _tw, _stepno, _loss in [
    (8, 3, "llama3_1-8b-8192-no-collective-matmul", 3.443, 413.433, 7138.890, 196608, 14, "2.136"),
    (16, 3, "llama3_1-8b-8192-no-collective-matmul", 3.393, 419.485, 7243.378, 393216, 14, "3.974"),
    (32, 3, "llama3_1-8b-8192-no-collective-matmul", 3.495, 407.225, 7031.689, 786432, 14, "5.864"),
    (64, 5, "llama3_1-8b-8192-bs5", 5.652, 419.701, 7247.111, 2621440, 14, "8.534"),
    (128, 4, "llama3_1-8b-8192", 4.602, 412.319, 7119.648, 4194304, 14, "9.285"),
    (256, 4, "llama3_1-8b-8192", 4.546, 417.397, 7207.336, 8388608, 14, "10.131"),
]:
    RUNS.append(
        _recipe(
            f"maxtext-v6e-llama3.1-8b-v6e{_chips}",
            "tpu-v6e",
            _chips,
            _V6E_TOPO[_chips],
            1,
            {"fsdp": _chips},
            {},
            _llama(**LLAMA31_8B, seq=8192, remat="custom", remat_custom=dict(_C8)),
            _pdb * _chips,
            _step,
            _tf,
            _tps,
            f"completed step: {_stepno}, seconds: {_step}, TFLOP/s/device: {_tf}, Tokens/s/device: "
            f"{_tps}, total_weights: {_tw}, loss: {_loss}",
            f"training/trillium/Llama3.1-8B-MaxText/v6e-{_chips}/README.md",
            C_TAG014,
            "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.4)",
            f"MaxText model {_cfg}: per_device_batch_size {_pdb}, ici_fsdp=-1, remat custom (offload "
            "decoder_layer_input, out_proj, query/key/value_proj to host; rest remat), flash "
            "attention (sa_block 2048), seq 8192, weight_dtype float32 (base default), synthetic "
            "data. XLA flags incl. SparseCore all-reduce offload and host-offload flags"
            + ("; collective matmul disabled" if "no-collective" in _cfg else "")
            + ". total_weights in the log = global tokens, consistent with the batch.",
        )
    )

for _chips, _pdb, _cfg, _step, _tf, _tps, _tw, _stepno, _loss, _wdt in [
    (
        32,
        2,
        "llama3_1-70b-8192-bs2-bfloat16-no-collective-matmul",
        17.790,
        443.385,
        920.965,
        524288,
        34,
        "11.457",
        "bfloat16",
    ),
    (64, 2, "llama3_1-70b-8192-bs2", 18.688, 422.091, 876.736, 1048576, 14, "0.865", "float32"),
    (128, 4, "llama3_1-70b-8192-bs4", 34.786, 453.500, 941.976, 4194304, 14, "4.174", "float32"),
    (256, 5, "llama3_1-70b-8192", 42.656, 462.297, 960.248, 10485760, 14, "6.658", "float32"),
]:
    RUNS.append(
        _recipe(
            f"maxtext-v6e-llama3.1-70b-v6e{_chips}",
            "tpu-v6e",
            _chips,
            _V6E_TOPO[_chips],
            1,
            {"fsdp": _chips},
            {},
            _llama(
                **LLAMA31_70B, seq=8192, remat="custom", remat_custom=dict(_C70), param_dtype=_wdt
            ),
            _pdb * _chips,
            _step,
            _tf,
            _tps,
            f"completed step: {_stepno}, seconds: {_step}, TFLOP/s/device: {_tf}, Tokens/s/device: "
            f"{_tps}, total_weights: {_tw}, loss: {_loss}",
            f"training/trillium/Llama3.1-70B-MaxText/v6e-{_chips}/README.md",
            C_TAG014,
            "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.4)",
            f"MaxText model {_cfg}: per_device_batch_size {_pdb}, ici_fsdp=-1, remat custom (offload "
            "decoder_layer_input and query/key/value_proj; rest remat), flash attention, seq 8192, "
            f"weight_dtype {_wdt}"
            + (
                " (set explicitly), collective matmul disabled"
                if _wdt == "bfloat16"
                else " (default)"
            )
            + ". No SparseCore offload flag for 70B. total_weights consistent with the batch.",
        )
    )

RUNS.append(
    _recipe(
        "maxtext-v6e-llama2-70b-v6e256",
        "tpu-v6e",
        256,
        "16x16",
        1,
        {"fsdp": 256},
        {},
        _llama(**LLAMA2_70B, seq=4096, remat="qkv_proj_offloaded"),
        512,
        9.052,
        402.274,
        905.021,
        "completed step: 16, seconds: 9.052, TFLOP/s/device: 402.274, Tokens/s/device: 905.021, "
        "total_weights: 2097152, loss: 1.104",
        "training/trillium/Llama2-70B-MaxText/README.md",
        C_TAG012,
        "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.2, llama2-70b-4096-sc)",
        "AMBIGUOUS BATCH: the quoted config says per_device_batch_size 3, but the log's "
        "total_weights 2097152 = 256 chips * 2 * 4096 and 905 tok/s/dev * 9.052 s = 8192 tokens per "
        "chip, i.e. the logged run used 2 sequences per chip; global_batch 512 follows the log. "
        "AXIS: MaxText used ici_fsdp_parallelism=1, ici_fsdp_transpose_parallelism=-1 (256), "
        "ici_tensor=1; fsdp_transpose is a second FSDP-like axis that shards the weights' other "
        "dimension; mapped to our fsdp here. remat qkv_proj_offloaded, flash, seq 4096, weights float32, "
        "SparseCore all-reduce offload.",
    )
)

RUNS.append(
    _recipe(
        "maxtext-v6e-mistral-7b-v6e8",
        "tpu-v6e",
        8,
        "2x4",
        1,
        {"fsdp": 8},
        {},
        _llama(**MISTRAL_7B, seq=8192, remat="custom", remat_custom=dict(_C8)),
        48,
        6.320,
        431.981,
        7776.813,
        "completed step: 6, seconds: 6.320, TFLOP/s/device: 431.981, Tokens/s/device: 7776.813, "
        "total_weights: 393216, loss: 7.378",
        "training/trillium/Mistral-7B-MaxText/README.md",
        C_TAG012,
        "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.2, mistral-7b)",
        "per_device_batch_size 6, ici_fsdp=-1, custom remat offloading decoder_layer_input, out_proj, "
        "q/k/v proj; flash, seq 8192; Mistral-7B dims (no sliding window in MaxText's mistral block "
        "config here). Logged at step 6 only (early step).",
    )
)

RUNS.append(
    _recipe(
        "maxtext-v6e-llama3.1-405b-2xv6e256",
        "tpu-v6e",
        256,
        "16x16",
        2,
        {"fsdp": 256},
        {"fsdp": 2},
        _llama(
            **LLAMA31_405B,
            seq=8192,
            remat="custom",
            remat_custom=_custom(decoder_layer_input="offload"),
        ),
        512,
        54.803,
        392.454,
        149.482,
        "completed step: 14, seconds: 54.803, TFLOP/s/device: 392.454, Tokens/s/device: 149.482, "
        "total_weights: 4194304, loss: 0.297",
        "training/trillium/Llama3.1-405B-MaxText/README.md",
        C_TAG012,
        "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.2, llama3-1-405b-8192-pure-fsdp-ici)",
        "2 slices of v6e-256; ici_fsdp 256 and dcn_fsdp 2 (FSDP across DCN, not data). "
        "per_device_batch_size 1, custom remat offloading only decoder_layer_input, flash, seq 8192.",
    )
)

RUNS.append(
    _recipe(
        "maxtext-v6e-gpt3-175b-bf16-v6e256",
        "tpu-v6e",
        256,
        "16x16",
        1,
        {"fsdp": 256},
        {},
        _llama(
            layers=96,
            d_model=12288,
            d_ff=49152,
            heads=96,
            kv_heads=96,
            vocab=50304,
            seq=2048,
            remat="full",
            tied=True,
            mlp="plain",
        ),
        768,
        17.182,
        384.891,
        357.580,
        "completed step: 15, seconds: 17.182, TFLOP/s/device: 384.891, Tokens/s/device: 357.580, "
        "total_weights: 1572864, loss: 388.622",
        "training/trillium/GPT3-175B-MaxText/bf16/README.md",
        C_TAG012,
        "maxtext_trillium_model_configs.py (tag tpu-recipes-v0.1.2, gpt-3-175b-bf16)",
        "GPT-3 175B as MaxText's gpt3-175b.yml: gelu (plain) MLP, LayerNorm and biases, learned "
        "position embedding (trainable_position_size 16384), tied logits, fused_qkv, vocab 50304, "
        "seq 2048 (base default; consistent with total_weights). per_device_batch_size 3, "
        "ici_fsdp=-1, remat full, flash. Optimizer adam_pax per the model yml.",
    )
)

RUNS.append(
    _recipe(
        "maxtext-v5p-llama3.1-405b-v5p1024",
        "tpu-v5p",
        512,
        "8x8x8",
        1,
        {"fsdp": 512},
        {},
        _llama(
            **LLAMA31_405B,
            seq=8192,
            remat="custom",
            remat_custom=_custom(context="offload", mlpwo="offload"),
        ),
        1024,
        131.474,
        314.530,
        124.618,
        "completed step: 10, seconds: 131.474, TFLOP/s/device: 314.530, Tokens/s/device: 124.618, "
        "total_weights: 8388608, loss: 4.453",
        "training/v5p/Llama3.1-405B-MaxText/README.md",
        C_V5P405,
        "maxtext_v5p_model_configs.py (llama3_1_405b_8192_v5p_1024)",
        "v5p-1024 = 512 chips (8x8x8 assumed standard shape). per_device_batch_size 2, ici_fsdp=-1, "
        "custom remat offloading context and mlpwo (decoder_layer_input kept on device, rest remat), "
        "num_vocab_tiling 4, flash, seq 8192, weight_dtype float32 default. The flops formula at "
        "3eb77db3 (after July 2025) may halve causal attention; step_s is what matters.",
    )
)

# --------------------------------------------------------------------------------------
# torchtitan on H100 (96 GB HBM2e, 500 W) - bf16 rows only
# --------------------------------------------------------------------------------------

# torchtitan selective *op* AC at 9dec370: inside each block, every aten.mm output is saved
# except every second one, plus SDPA outputs; in Llama block order (wq, wk, wv, sdpa, wo, w1,
# w3, w2) that saves wq, wv, attention, w1, w2 and recomputes wk, wo, w3.
_TT_SAC = _custom(
    decoder_layer_input="device",
    query_proj="device",
    value_proj="device",
    context="device",
    mlpwi_0="device",
    mlpwo="device",
    key_proj="remat",
    out_proj="remat",
    mlpwi_1="remat",
)

for _gpus, _compile, _tps, _mem, _tbl in [
    (8, False, 5762, 82.4, "Table 1"),
    (8, True, 6667, 77.0, "Table 1"),
    (128, False, 5605, 67.0, "Table 3"),
    (128, True, 6514, 62.0, "Table 3"),
]:
    _hosts = _gpus // 8
    RUNS.append(
        {
            "id": f"torchtitan-h100-llama3.1-8b-fsdp{_gpus}" + ("-compile" if _compile else ""),
            "hardware": "h100-sxm",
            "hosts": _hosts,
            "ici": {"fsdp": 8},
            "dcn": {"fsdp": _hosts} if _hosts > 1 else {},
            "model": _llama(**LLAMA31_8B, seq=8192, remat="custom", remat_custom=dict(_TT_SAC)),
            "global_batch": 2 * _gpus,
            "per_device_batch": 2,
            "measured": {
                "tokens_per_s_per_device": float(_tps),
                "peak_memory_gib": _mem,
                "derived_step_s": round(2 * 8192 / _tps, 4),
            },
            "source": (
                f"{_TT}{C_TT_BENCH}/benchmarks/llama3_h100_202412_torchtitan.md ({_tbl}, "
                f"row 'FSDP{' + torch.compile' if _compile else ''}'); run at torchtitan "
                f"{C_TT_RUN}, config train_configs/llama3_8b.toml"
            ),
            "notes": (
                "Llama 3.1 8B, FSDP2 only, local batch 2, selective op activation checkpointing "
                "(expressed as remat custom: saves wq/wv/attention/w1/w2 outputs, recomputes wk/wo/w3; "
                "closest MaxText preset would be between save_qkv_proj and save_dot_except_mlp). "
                "seq_len not printed in the table: 8192 is the llama3_8b.toml default at the run "
                "commit (ASSUMED). bf16 compute via FSDP2 MixedPrecisionPolicy, fp32 sharded "
                "params, SDPA flash attention, untied embeddings. "
                + ("torch.compile on. " if _compile else "eager (no compile). ")
                + "HARDWARE CAVEAT: H100 96 GB HBM2e at 500 W power limit (Grand Teton), 400 Gb/s "
                "RDMA per GPU; slower than a 700 W H100 SXM5. TPS read at iteration 90."
            ),
        }
    )

RUNS.append(
    {
        "id": "torchtitan-h100-llama3.1-405b-fsdp16-tp8",
        "hardware": "h100-sxm",
        "hosts": 16,
        "ici": {"tensor": 8},
        "dcn": {"fsdp": 16},
        "model": _llama(**LLAMA31_405B, seq=8192, remat="full"),
        "global_batch": 32,
        "per_device_batch": 2 / 8,
        "measured": {
            "tokens_per_s_per_device": 109.0,
            "mfu": 0.29,
            "derived_step_s": round(32 * 8192 / (109.0 * 128), 3),
        },
        "source": (
            f"{_TT}{C_TT_DOC405}/docs/performance.md ('Llama 3.1 performance numbers', 405B, "
            "optimizations None); config train_configs/llama3_405b.toml at that commit"
        ),
        "notes": (
            "128 H100 (95/96 GB HBM2e, lower TDP), FSDP 16 x TP 8, local batch 2 per FSDP rank "
            "(global 32), full AC, bf16 (the Float8 rows excluded). seq 8192 from llama3_405b.toml. "
            "MFU 29.0% is against the SXM peak (source footnote says true MFU is higher). The toml at "
            "that commit sets compile=true; whether the 'None' row used compile is not stated."
        ),
    }
)

# --------------------------------------------------------------------------------------
# Megatron-LM GPT weak scaling on H100 (only pipeline size 1 rows)
# --------------------------------------------------------------------------------------

for _size, _heads, _h, _layers, _tp, _dp, _gpus, _gbs, _tf, _mfu in [
    ("1.7b", 16, 2048, 24, 1, 48, 48, 192, 408.8, 0.41),
    ("7.1b", 32, 4096, 30, 2, 48, 96, 192, 465.9, 0.47),
    ("16b", 48, 6144, 32, 4, 48, 192, 192, 489.1, 0.49),
    ("32b", 56, 7168, 48, 8, 48, 384, 192, 459.6, 0.46),
]:
    _hosts = _gpus // 8
    _within = 8 // _tp
    _m = {
        "kind": "transformer",
        "layers": _layers,
        "d_model": _h,
        "d_ff": 4 * _h,
        "heads": _heads,
        "kv_heads": _heads,
        "head_dim": _h // _heads,
        "vocab": 131072,
        "seq_len": 4096,
        "mlp": "plain",
        "dtype": "bfloat16",
        "param_dtype": "bfloat16",
        "remat": "none",
        "attention": "flash",
        "tied_embeddings": False,
    }
    _ici = {"tensor": _tp} if _tp > 1 else {}
    if _within > 1:
        _ici["data"] = _within
    RUNS.append(
        {
            "id": f"megatron-h100-gpt-{_size}",
            "hardware": "h100-sxm",
            "hosts": _hosts,
            "ici": _ici,
            "dcn": {"data": _dp // _within},
            "model": _m,
            "global_batch": _gbs,
            "per_device_batch": _gbs / _dp,
            "measured": {
                "tflops_per_device": _tf,
                "mfu": _mfu,
                "peak_tflops": 989.0,
                "flops_formula": "megatron",
                "derived_step_s": round(_megatron_flops(_m, _gbs) / (_tf * 1e12 * _gpus), 4),
            },
            "source": f"{_MLM}{C_MLM}/images/model_table.png (README 'Training Speed and Scalability' table, {_size.upper()} row)",
            "notes": (
                f"GPT {_size.upper()}: TP {_tp}, PP 1, DP {_dp}, {_gpus} H100, global batch {_gbs}, "
                "seq 4096, vocab 131072. NOT STATED in the source (assumed): ffn = 4*hidden with GeLU "
                "(Megatron GPT default, no swiglu), MHA, untied embeddings (inferred: the quoted sizes "
                "1.7B/7.1B/16B/32B match 12*L*h^2 plus TWO vocab*h matrices), no "
                "activation recomputation, TE flash attention, bf16 with fp32 master weights in the "
                "distributed optimizer (overlap-param-gather implies the distributed optimizer, i.e. "
                "ZeRO-1-like sharded optimizer state over 'data'). Overlaps: --overlap-grad-reduce, "
                "--overlap-param-gather, --tp-comm-overlap. Throughput is end-to-end incl. data "
                "loading and logging. derived_step_s inverts Megatron's FLOP formula with these "
                "assumed dims."
            ),
        }
    )

# --------------------------------------------------------------------------------------
# MaxText (JAX) on NVIDIA GPUs: the published-gpu-jax profile (issue 39's named sources)
# --------------------------------------------------------------------------------------

_JT = "https://github.com/NVIDIA/JAX-Toolbox/blob/"
_GRC = "https://github.com/AI-Hypercomputer/gpu-recipes/blob/"
LLAMA2_7B = {
    "layers": 32,
    "d_model": 4096,
    "d_ff": 11008,
    "heads": 32,
    "kv_heads": 32,
    "vocab": 32000,
}

RUNS.append(
    {
        "id": "jax-toolbox-h100-llama2-7b-1node",
        "hardware": "h100-sxm",
        "hosts": 1,
        "ici": {"fsdp": 8},
        "dcn": {},
        # MaxText's minimal_flash of 2024: the projections and the attention's output
        "model": _llama(**LLAMA2_7B, seq=4096, remat="minimal_with_context"),
        "global_batch": 16,
        "per_device_batch": 2,
        "measured": {"step_s": 0.721, "sequences_per_s": 22.19},
        "framework": "jax",
        "source": (
            f"{_JT}db0968810ec4f2207d909f6df89bf0847422b3b3/rosetta/rosetta/projects/maxtext/"
            "README.md (the MaxText table's one row: 1 node, FSDP 8, GBS 16, flash, BF16)"
        ),
        "notes": (
            "8 H100 80 GB SXM. Table: DP 1, FSDP 8, TP 1, global batch 16, flash attention, "
            "scan off, 0.721 s a step. Config from scripts/example_slurm.sub at the same "
            "commit: seq 4096, remat minimal_flash (read as minimal_with_context: it saves "
            "the dots and the attention's output), cudnn_flash_te, weight_dtype not set "
            "(MaxText's default float32 assumed). Which step was timed is not stated."
        ),
    }
)
RUNS.append(
    {
        "id": "gpu-recipes-a3ultra-llama3.1-70b-256gpu",
        "hardware": "h200-sxm",
        "hosts": 32,
        "ici": {"fsdp": 8},
        "dcn": {"data": 2, "fsdp": 16},
        "model": _llama(**LLAMA31_70B, seq=8192, remat="save_dot_except_mlp"),
        "global_batch": 512,
        "per_device_batch": 2,
        "measured": {
            "step_s": 15.516,
            "tflops_per_device": 508.371,
            "tokens_per_s_per_device": 1055.949,
        },
        "framework": "jax",
        "source": (
            f"{_GRC}a3b9cabaa8e9f31ecd73c65e38be307c801841bb/training/a3ultra/llama-3.1-70b/"
            "maxtext-pretraining-gke/README.md (its log line, step 12)"
        ),
        "notes": (
            "256 H200 (A3 Ultra). Config src/frameworks/a3ultra/maxtext-configs/"
            "llama-3.1-70b-256gpus-a3u-bf16.yaml at that commit: ici_fsdp 8, dcn_fsdp 16, "
            "dcn_data 2, per_device_batch 2, seq 8192, remat save_dot_except_mlp, "
            "cudnn_flash_te, weight_dtype not set (float32 assumed). The log line's "
            "total_weights 4194304 = 2 x 256 x 8192 ties it to this config; bf16 rests on the "
            "README's default job and its MFU against the BF16 peak."
        ),
    }
)
RUNS.append(
    {
        "id": "gpu-recipes-a3mega-llama2-7b-256gpu",
        "hardware": "h100-sxm",
        "hosts": 32,
        "ici": {"fsdp": 8},
        "dcn": {"data": 32},
        "model": _llama(**LLAMA2_7B, seq=4096, remat="minimal_with_context"),
        "global_batch": 1024,
        "per_device_batch": 4,
        "measured": {
            "step_s": 1.500,
            "tflops_per_device": 503.384,
            "tokens_per_s_per_device": 10922.973,
        },
        "framework": "jax",
        "held_out": True,
        "source": (
            f"{_GRC}d57d2223fa1130d187f3a9fde3a3d15add90b4e1/training/a3mega/llama-2-7b/"
            "maxtext-pretraining-gke/README.md (its log line, step 12)"
        ),
        "notes": (
            "A check, never fitted: A3 Mega is not among the sources issue 39 names for "
            "published-gpu-jax. 256 H100, ici_fsdp 8, dcn_data 32, per_device_batch 4, seq "
            "4096, remat minimal_flash (as minimal_with_context), weight_dtype float32 assumed "
            "(config llama-2-7b-256gpus-a3mega-bf16.yaml at that commit)."
        ),
    }
)

_MT_A3 = "30cd40a5c8ed02519ddb77682e3ca72b8724f927"
for _nodes, _tf in ((1, 492), (2, 422), (4, 407), (8, 409), (16, 375)):
    RUNS.append(
        {
            "id": f"maxtext-a3-llama2-7b-{_nodes}node",
            "hardware": "h100-a3-high",
            "hosts": _nodes,
            "ici": {"fsdp": 8},
            "dcn": {"data": _nodes} if _nodes > 1 else {},
            "model": _llama(**LLAMA2_7B, seq=4096, remat="minimal_with_context"),
            "global_batch": 32 * _nodes,
            "per_device_batch": 4,
            "measured": {"tflops_per_device": float(_tf), "flops_formula": "maxtext-2023-12"},
            "framework": "jax",
            "held_out": True,
            "source": (
                f"{_MT}{_MT_A3}/MaxText/configs/a3/llama_2_7b/README.md ({_nodes}x A3 "
                "(h100-80gb-8)); configs MaxText/configs/a3/llama_2_7b/{1,2,4,8,16}vm.sh"
            ),
            "notes": (
                "A check, never fitted: issue 39 names these runs as held out. A3 "
                "(h100-80gb-8) is xpk's a3-highgpu-8g, Google Cloud's A3 High (GPUDirect-TCPX "
                "between nodes). Scripts: ici_fsdp 8, dcn_data = nodes, per_device_batch 4, seq "
                "4096, remat minimal_flash (as minimal_with_context), cudnn_flash_te, "
                "weight_dtype not set (float32 assumed). TFLOP/s to step time with causal "
                "attention counted half (maxtext-2023-12): 1.45 s on one node and 1.91 s on "
                "16, the step times issue 39 quotes."
            ),
        }
    )

# --------------------------------------------------------------------------------------
# derived step times for TFLOP/s-only MaxText rows
# --------------------------------------------------------------------------------------

for _r in RUNS:
    _meas = _r["measured"]
    if "step_s" in _meas or "derived_step_s" in _meas:
        continue
    _conv = _meas.get("flops_formula", "")
    if _conv.startswith("maxtext-2023"):
        _f = _maxtext_flops_per_device(_r["model"], _r["per_device_batch"], _conv)
        _meas["derived_step_s"] = round(_f / (_meas["tflops_per_device"] * 1e12), 4)
        _meas["derived_n_params"] = _n_params(_r["model"])

# --------------------------------------------------------------------------------------
# published fit / OOM boundaries
# --------------------------------------------------------------------------------------

_MT_OOM_2957 = "8c9fede595b4481b8599846e040441f1c78d5baa"
_MT_505 = "475f408ae6c5b18dc420315a4fc058c8658a3b9c"
_MT_4117 = "2b78bfa0dcb8c6c9f3e8f98f06792b6e57e4d484"
_MT_4081 = "0ad8d3f735ec42e692cbc6551565e128b5c940e9"
_MT_3977 = "80fdc09350292afeaaa57c16c136b287a4883395"


def _v4_2024_model(kind: str, attention: str) -> dict:
    """v4 22b.sh / 52b.sh dims on top of the 2024+ Llama-style base (head_dim 128, silu-gated)."""
    if kind == "22b":
        layers, e, heads, ff = 48, 6144, 24, 24576
    else:
        layers, e, heads, ff = 32, 12288, 32, 49152
    return _llama(
        layers=layers,
        d_model=e,
        d_ff=ff,
        heads=heads,
        kv_heads=heads,
        vocab=32000,
        seq=2048,
        remat="full",
        attention=attention,
    )


OOM_BOUNDARIES: list[dict] = [
    {
        "id": "maxtext-v5p128-llama2-70b-pdb4-oom",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "slices": 1,
        "ici": {"fsdp": 64},
        "dcn": {},
        "model": _llama(**LLAMA2_70B, seq=4096, remat="save_dot_except_mlpwi"),
        "global_batch": 256,
        "per_device_batch": 4,
        "fits": False,
        "evidence": "PR #2957 (merged 2026-01-22): 'the benchmark configuration for Llama2-70b "
        "training on v5p-128 encounters OOM'; batch 4 OOM, batch 2 succeeds.",
        "source": f"{_MT}{_MT_OOM_2957}/benchmarks/maxtext_v5p_model_configs.py (llama2_70b_v5p_128); "
        "github.com/AI-Hypercomputer/maxtext/pull/2957",
        "notes": "v5p-128 = 64 chips (95 GiB HBM each). ici_fsdp=-1, weights float32, attention "
        "autoselected (flash on TPU), use_iota_embed, synthetic data. OOM was at run time.",
    },
    {
        "id": "maxtext-v5p128-llama2-70b-pdb2-fits",
        "hardware": "tpu-v5p",
        "topology": "4x4x4",
        "slices": 1,
        "ici": {"fsdp": 64},
        "dcn": {},
        "model": _llama(**LLAMA2_70B, seq=4096, remat="save_dot_except_mlpwi"),
        "global_batch": 128,
        "per_device_batch": 2,
        "fits": True,
        "evidence": "Same PR: training with batch size 2 succeeds.",
        "source": f"{_MT}{_MT_OOM_2957}/benchmarks/maxtext_v5p_model_configs.py (llama2_70b_v5p_128)",
        "notes": "Pair of the row above.",
    },
    {
        "id": "maxtext-v4-384x2-52b-pdb7-oom",
        "hardware": "tpu-v4",
        "topology": "4x4x12",
        "slices": 2,
        "ici": {"fsdp": 192},
        "dcn": {"data": 2},
        "model": _v4_2024_model("52b", "dot"),
        "global_batch": 7 * 192 * 2,
        "per_device_batch": 7,
        "fits": False,
        "evidence": "PR #4117 (2026-06): AOT compile of 52b.sh for 2 x v4-384 fails with HBM OOM "
        "'Used 33.27G of 30.75G'.",
        "source": f"{_MT}{_MT_4117}/src/maxtext/configs/tpu/v4/52b.sh (parent commit = failing "
        "config); github.com/AI-Hypercomputer/maxtext/pull/4117",
        "notes": "remat full, tensor 1, attention 'autoselected' (the fix forces flash, so the "
        "failing build presumably used dot-product: recorded as 'dot', ASSUMED), "
        "num_vocab_tiling 1, weights float32, seq 2048. Dims: emb 12288, 32 q = 32 kv "
        "heads of head_dim 128 (attention width 4096 != emb), mlp 49152 silu-gated, "
        "32 layers, vocab 32000. v4 HBM 32 GiB (30.75G usable per the message).",
    },
    {
        "id": "maxtext-v4-384x2-52b-pdb7-flash-vocabtile-fits",
        "hardware": "tpu-v4",
        "topology": "4x4x12",
        "slices": 2,
        "ici": {"fsdp": 192},
        "dcn": {"data": 2},
        "model": _v4_2024_model("52b", "flash"),
        "global_batch": 7 * 192 * 2,
        "per_device_batch": 7,
        "fits": True,
        "evidence": "PR #4117: with attention=flash and num_vocab_tiling=8 the AOT compile succeeds.",
        "source": f"{_MT}{_MT_4117}/src/maxtext/configs/tpu/v4/52b.sh",
        "notes": "Needs vocab (logit) tiling x8, which our model schema does not express.",
    },
    {
        "id": "maxtext-v4-128-22b-pdb13-oom",
        "hardware": "tpu-v4",
        "topology": "4x4x4",
        "slices": 1,
        "ici": {"fsdp": 64},
        "dcn": {},
        "model": _v4_2024_model("22b", "dot"),
        "global_batch": 13 * 64,
        "per_device_batch": 13,
        "fits": False,
        "evidence": "PR #4081 / commit 0ad8d3f7 (2026-06): HBM OOM in AOT compile for v4-128 at "
        "per_device_batch_size=13; vocab tiling saves ~1.4 GB and makes it fit.",
        "source": f"{_MT}{_MT_4081}/src/maxtext/configs/tpu/v4/22b.sh (parent = failing config)",
        "notes": "Slice count of the failing AOT target not stated in the commit (the script's "
        "example compiles 2 slices); recorded as 1. Attention autoselected -> 'dot' "
        "ASSUMED (fix forces flash). Dims: emb 6144, 24 heads x 128, mlp 24576 gated, "
        "48 layers, vocab 32000, seq 2048, weights float32.",
    },
    {
        "id": "maxtext-v4-128-22b-pdb15-oom-2024",
        "hardware": "tpu-v4",
        "topology": "4x4x4",
        "slices": 2,
        "ici": {"fsdp": 64},
        "dcn": {"data": 2},
        "model": _v4_2024_model("22b", "flash"),
        "global_batch": 15 * 64 * 2,
        "per_device_batch": 15,
        "fits": False,
        "evidence": "PR #505 (2024-03-12, commit 475f408a): 'Was seeing OOM failures in the nightly "
        "XLML AOT tests'; 22B pdb 15 -> 13, 52B pdb 8 -> 7.",
        "source": f"{_MT}{_MT_505}/MaxText/configs/v4/22b.sh; "
        "github.com/AI-Hypercomputer/maxtext/pull/505",
        "notes": "AOT target as in the script comment: v4-128 x 2 slices (ASSUMED to be the nightly "
        "target). Attention autoselected at the time; recorded 'flash' but uncertain. "
        "pdb 13 then compiled (fits) at that software version, yet by 2026 pdb 13 needed "
        "vocab tiling (row above): the boundary moves with compiler/software versions.",
    },
    {
        "id": "maxtext-v4-128-22b-pdb13-fits-2024",
        "hardware": "tpu-v4",
        "topology": "4x4x4",
        "slices": 2,
        "ici": {"fsdp": 64},
        "dcn": {"data": 2},
        "model": _v4_2024_model("22b", "flash"),
        "global_batch": 13 * 64 * 2,
        "per_device_batch": 13,
        "fits": True,
        "evidence": "PR #505: lowered to 13 to pass the AOT tests (March 2024 software).",
        "source": f"{_MT}{_MT_505}/MaxText/configs/v4/22b.sh",
        "notes": "See the pdb-15 row; attention uncertain.",
    },
    {
        "id": "maxtext-v4-384-52b-pdb8-oom-2024",
        "hardware": "tpu-v4",
        "topology": "4x4x12",
        "slices": 2,
        "ici": {"fsdp": 192},
        "dcn": {"data": 2},
        "model": _v4_2024_model("52b", "flash"),
        "global_batch": 8 * 192 * 2,
        "per_device_batch": 8,
        "fits": False,
        "evidence": "PR #505 (2024-03-12): 52B pdb 8 -> 7 for AOT OOM.",
        "source": f"{_MT}{_MT_505}/MaxText/configs/v4/52b.sh",
        "notes": "Slice count ASSUMED 2 (nightly AOT target); attention uncertain.",
    },
    {
        "id": "maxtext-v5e256-llama2-13b-pdb8-oom",
        "hardware": "tpu-v5e",
        "topology": "16x16",
        "slices": 1,
        "ici": {"fsdp": 256},
        "dcn": {},
        "model": _llama(**LLAMA2_13B, seq=2048, remat="qkv_proj_offloaded"),
        "global_batch": 8 * 256,
        "per_device_batch": 8,
        "fits": False,
        "evidence": "PR #3977 (2026-05-26) 'Update v5e benchmark to support QWIX and fix OOM': "
        "llama2-13b-v5e-256 per_device_batch_size 8 -> 6.",
        "source": f"{_MT}{_MT_3977}/benchmarks/maxtext_v5e_model_configs.py (llama2_13b_v5e_256); "
        "github.com/AI-Hypercomputer/maxtext/pull/3977",
        "notes": "ici_fsdp=-1, qkv_proj_offloaded remat, seq 2048, weights float32, attention "
        "autoselected. The same PR also added use_qwix_quantization=True (no quantization "
        "type set), so the fix is not purely the batch change. v5e HBM 16 GiB.",
    },
    {
        "id": "maxtext-v5e256-llama2-13b-pdb6-fits",
        "hardware": "tpu-v5e",
        "topology": "16x16",
        "slices": 1,
        "ici": {"fsdp": 256},
        "dcn": {},
        "model": _llama(**LLAMA2_13B, seq=2048, remat="qkv_proj_offloaded"),
        "global_batch": 6 * 256,
        "per_device_batch": 6,
        "fits": True,
        "evidence": "PR #3977 test links show the llama2_13b_v5e_256 run passing at pdb 6.",
        "source": f"{_MT}{_MT_3977}/benchmarks/maxtext_v5e_model_configs.py",
        "notes": "Pair of the row above.",
    },
    {
        "id": "torchtitan-h100-llama3.1-405b-fsdp128-oom",
        "hardware": "h100-sxm",
        "hosts": 16,
        "ici": {"fsdp": 8},
        "dcn": {"fsdp": 16},
        "model": _llama(**LLAMA31_405B, seq=8192, remat="full"),
        "global_batch": 256,
        "per_device_batch": 2,
        "fits": False,
        "evidence": "docs/performance.md: 'We do see OOM for 1D parallelism (FSDP2)' for 405B on "
        "128 H100, so only FSDP+TP was reported.",
        "source": f"{_TT}{C_TT_DOC405}/docs/performance.md (Llama 3.1 performance numbers)",
        "notes": "Batch for the OOM attempt is not stated: local batch 2 (as in the reported 2-D "
        "runs) ASSUMED; full AC, bf16, 96 GB HBM2e H100. The 2-D run (FSDP16 x TP8, "
        "local batch 2) fits: see RUNS torchtitan-h100-llama3.1-405b-fsdp16-tp8.",
    },
]

# torchtitan Dec 2024 rows carry measured peak memory: fits=True with a number.
for _r in RUNS:
    if _r["id"].startswith("torchtitan-h100-llama3.1-8b"):
        OOM_BOUNDARIES.append(
            {
                "id": _r["id"] + "-mem",
                "hardware": _r["hardware"],
                "hosts": _r["hosts"],
                "ici": dict(_r["ici"]),
                "dcn": dict(_r["dcn"]),
                "model": _r["model"],
                "global_batch": _r["global_batch"],
                "per_device_batch": 2,
                "fits": True,
                "peak_memory_gib": _r["measured"]["peak_memory_gib"],
                "evidence": "Measured peak memory in the benchmark table (max over GPUs).",
                "source": _r["source"],
                "notes": "96 GB HBM2e H100; " + _r["notes"],
            }
        )

# --------------------------------------------------------------------------------------
# measured runs our planner cannot express (pipeline parallel, context parallel, fp8/int8,
# local attention, unknown configs), kept for completeness
# --------------------------------------------------------------------------------------

UNSUPPORTED: list[dict] = []

for _size, _heads, _h, _layers, _tp, _pp, _gpus, _gbs, _tf, _mfu in [
    ("70b", 64, 8192, 84, 8, 2, 768, 384, 419.7, 0.42),
    ("119b", 80, 10240, 92, 8, 4, 1536, 768, 420.5, 0.43),
    ("177b", 96, 12288, 96, 8, 6, 2304, 1152, 432.8, 0.44),
    ("314b", 128, 16384, 96, 8, 8, 3072, 1536, 474.4, 0.48),
    ("462b", 144, 18432, 112, 8, 16, 6144, 3072, 459.9, 0.47),
]:
    UNSUPPORTED.append(
        {
            "id": f"megatron-h100-gpt-{_size}",
            "reason": f"pipeline parallel size {_pp} > 1",
            "hardware": "h100-sxm",
            "hosts": _gpus // 8,
            "parallelism": {"tensor": _tp, "pipeline": _pp, "data": 48},
            "model": {
                "layers": _layers,
                "d_model": _h,
                "heads": _heads,
                "vocab": 131072,
                "seq_len": 4096,
            },
            "global_batch": _gbs,
            "measured": {"tflops_per_device": _tf, "mfu": _mfu, "flops_formula": "megatron"},
            "source": f"{_MLM}{C_MLM}/images/model_table.png ({_size.upper()} row)",
            "notes": "Same assumptions as the PP=1 Megatron rows in RUNS.",
        }
    )

UNSUPPORTED += [
    {
        "id": "maxtext-v5p-1160b",
        "reason": "no published config for the 1160B runs (v5p-7680: 2.95e+02 TFLOP/s, 64.27%; "
        "v5p-12288: 3.04e+02, 66.23%)",
        "hardware": "tpu-v5p",
        "measured": {
            "v5p-7680": {"tflops_per_device": 295.0, "mfu": 0.6427},
            "v5p-12288": {"tflops_per_device": 304.0, "mfu": 0.6623},
        },
        "source": f"{_MT}04262f3cf5d4f1b064c484e3cbc2ca2a722f9d32/README.md (TPU v5p table)",
        "notes": "Only the top-level README lists them; no script in MaxText/configs/v5p.",
    },
    {
        "id": "torchtitan-h100-llama3.1-70b-fsdp32-tp8-fp8",
        "reason": "Float8 linear layers",
        "hardware": "h100-sxm",
        "hosts": 32,
        "parallelism": {"fsdp": 32, "tensor": 8},
        "global_batch": 512,
        "measured": {
            "2D": {"tokens_per_s_per_device": 829, "peak_memory_gib": 71.9},
            "2D+AsyncTP": {"tokens_per_s_per_device": 876, "peak_memory_gib": 67.6},
        },
        "source": f"{_TT}{C_TT_BENCH}/benchmarks/llama3_h100_202412_torchtitan.md (Table 4)",
        "notes": "Llama 3.1 70B, local batch 16, full AC, torch.compile; seq presumably 8192.",
    },
    {
        "id": "torchtitan-h100-llama3.1-8b-float8",
        "reason": "Float8 linear layers",
        "hardware": "h100-sxm",
        "measured": {
            "8 GPUs": {"tokens_per_s_per_device": 8532, "peak_memory_gib": 76.8},
            "128 GPUs": {"tokens_per_s_per_device": 8380, "peak_memory_gib": 61.8},
        },
        "source": f"{_TT}{C_TT_BENCH}/benchmarks/llama3_h100_202412_torchtitan.md (Tables 1, 3)",
        "notes": "FSDP + torch.compile + Float8 rows.",
    },
    {
        "id": "torchtitan-h100-llama3.1-8b-cp",
        "reason": "context parallel + Float8",
        "hardware": "h100-sxm",
        "hosts": 1,
        "measured": {
            "FSDP8 CP1 seq32768": 3890,
            "FSDP4 CP2 seq65536": 2540,
            "FSDP2 CP4 seq131072": 1071,
            "FSDP1 CP8 seq262144": 548,
        },
        "source": f"{_TT}{C_TT_BENCH}/benchmarks/llama3_h100_202412_torchtitan.md (Table 2)",
        "notes": "tokens/s per GPU; local batch 1, full AC, compile, Float8.",
    },
    {
        "id": "torchtitan-h100-llama3.1-405b-pp8",
        "reason": "pipeline parallel 8 (+ Float8, context parallel in Table 6)",
        "hardware": "h100-sxm",
        "hosts": 64,
        "parallelism": {"fsdp": 8, "tensor": 8, "pipeline": 8},
        "measured": {
            "1F1B": 100,
            "Interleaved 1F1B": 128,
            "4D CP1 seq32768": 76,
            "CP2 seq65536": 47,
            "CP4 seq131072": 31,
            "CP8 seq262144": 16,
        },
        "source": f"{_TT}{C_TT_BENCH}/benchmarks/llama3_h100_202412_torchtitan.md (Tables 5, 6)",
        "notes": "tokens/s per GPU; full AC; Table 5 local batch 32, global 256.",
    },
    {
        "id": "maxtext-v5p-gpt3-175b-v5p1024-int8",
        "reason": "int8 quantized training (MLPerf 4.0 scripts use quantization=int8)",
        "hardware": "tpu-v5p",
        "topology": "8x8x8",
        "slices": 1,
        "parallelism": {"data": 1, "fsdp": 64, "tensor": 8},
        "global_batch": 2048,
        "measured": {
            "step_s": 22.197,
            "tflops_per_device": 397.246,
            "tokens_per_s_per_device": 369.059,
        },
        "source": f"{_TR}training/v5p/GPT3-175B-MaxText/README.md; "
        f"{_MT}28e5097ac467ed8b1d17676d68aa5acc50f9d60d~1/MaxText/configs/v5p/gpt3_175b/v5p_1024.sh",
        "notes": "The recipe lists scripts for v5p-1024..12288 but the single log line does not say "
        "which; total_weights 4194304 with 8192 tokens/chip implies 512 chips (v5p-1024: "
        "pdb 4, remat full, ici data 1 / fsdp 64 / tensor 8). Logged at step 2 only.",
    },
    {
        "id": "maxtext-v6e-gemma3-12b-32k",
        "reason": "Gemma 3 interleaved local (sliding-window 1024) / global attention, 32k context",
        "hardware": "tpu-v6e",
        "topology": "16x16",
        "slices": 1,
        "measured": {
            "step_s": 7.318,
            "tflops_per_device": 349.442,
            "tokens_per_s_per_device": 4477.768,
        },
        "source": f"{_TR}training/trillium/Gemma3-12B-MaxText/v6e-256/README.md (MaxText "
        "tpu-recipes-v0.1.5)",
        "notes": "pdb 1, seq 32768, ici_fsdp=-1, custom remat (q/k/v remat). 2x and 4x v6e-256 "
        "variants exist in the same repo.",
    },
    {
        "id": "torchtitan-a100-llama",
        "reason": "A100 80GB is not in our hardware catalog",
        "hardware": "a100-80gb",
        "measured": {
            "llama3-8b selective op": {"tokens_per_s_per_device": 2973, "mfu": 0.582},
            "llama3-70b full": {"tokens_per_s_per_device": 331, "mfu": 0.517},
        },
        "source": f"{_TT}1d5815c4b1b9083cbc733b99c8b8ef39124a67d1/docs/performance.md (Llama 3 / Llama 2 tables, 64 A100)",
        "notes": "Also an OOM boundary there: Llama 2 70B, FSDP 64, local batch 2 with selective "
        "AC OOMs on 64 A100 80GB (footnote 3); local batch 2 with full AC fits.",
    },
]


# --------------------------------------------------------------------------------------
# light self-checks (cheap, run on import)
# --------------------------------------------------------------------------------------


def _check() -> None:
    ids = [r["id"] for r in RUNS] + [r["id"] for r in OOM_BOUNDARIES]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for r in RUNS + OOM_BOUNDARIES:
        devices = _chips_of(r)
        prod = 1
        for v in list(r["ici"].values()) + list(r["dcn"].values()):
            prod *= v
        assert prod == devices, (r["id"], prod, devices)
        if "topology" in r:
            per_slice = devices // r.get("slices", 1)
            ici = 1
            for v in r["ici"].values():
                ici *= v
            assert ici == per_slice, (r["id"], ici, per_slice)
    for r in RUNS:
        m = r["measured"]
        if "step_s" in m and "tokens_per_s_per_device" in m:
            implied = r["global_batch"] * r["model"]["seq_len"] / (m["step_s"] * _chips_of(r))
            assert abs(implied / m["tokens_per_s_per_device"] - 1) < 0.01, r["id"]


_check()
