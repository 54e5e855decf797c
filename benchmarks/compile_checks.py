"""Compile checks: end to end vs a direct compile, a cached repeat, and estimate vs XLA.

    .venv/bin/python -m benchmarks.compile_checks [--json] [--table-only | --variations]

``run() -> rows`` (for ``make bench``):

- ``check_256``: a 256-chip (``v5e:16x16``, fsdp 16 x tensor 16) MLP step ``[8192, 32768,
  8192]`` bf16, batch 4096, as a compile check through the service in this process
  (``TestClient``, the real compile worker, already warm), POST to ``done``; against
  ``direct_256``: ``abstract_train_step`` + ``jax.jit(...).lower(...).compile()`` of the
  same step here. Target ratio <= 1.2.
- ``cached_repeat``: the same check again, answered from the SQLite cache (< 50 ms).
- ``estimate_vs_xla``: one row per case of :data:`CASES` (v5e, v5p, v6e; 8 to 65,536
  chips; fitting and not): the plan's memory estimate (``cost.memory_estimate``) against
  the HBM XLA allocates for the compiled step (``memory_analysis().total_allocation_bytes``,
  ``compile_step``'s ``hbm_peak_bytes``), and both ``fits`` verdicts. Where XLA refuses
  the step for memory, its error text's figure (``(51.20G) exceeds available HBM``,
  10 MiB resolution) is what the estimate is compared with. ``xla_peak_bytes``
  (``peak_memory_in_bytes``) is shown beside it.
- ``transposed_update``: one row per compile of :data:`VARIATIONS`, the study behind
  v6e's transposed update (below): the estimate without and with
  ``update_layout_copies`` against XLA's HBM figure.

Which XLA figure (libtpu 0.0.50.1, jax 0.12.0.1; ``XLA_FLAGS=--xla_dump_to=...
--xla_dump_hlo_as_text``, ``*-memory-usage-report.txt``, ``*-buffer-assignment.txt``,
``*-live-range.txt``): the comparison used ``peak_memory_in_bytes`` until now. On TPU that
figure also counts buffers in on-chip VMEM (memory space 1, ``S(1)`` layouts), which take
no HBM. ``total_allocation_bytes`` equals, in every case, the memory-usage report's
``default (color=0)`` total, i.e. HBM only: for v5e data8 ``[1024, 4096, 1024]``
49.60 MiB HBM + 76.03 MiB VMEM, peak 136.56 MiB. XLA's own OOM verdict uses that HBM
figure: the refused cases quote it (v5e fsdp16 transformer S2048: report's HBM total
51.20 GiB, error ``(51.20G)``, while HBM + VMEM would be 51.28G), and that step with a
donated pass-through ballast array compiles with ``total_allocation_bytes`` 15.74 GiB and
``peak_memory_in_bytes`` 15.83 GiB, above the ``available HBM (15.75G)``, and is refused
(``(15.77G)``) once the HBM figure passes 15.75 GiB. So ``compile_train_step``'s ``fits``
is now judged on ``hbm_peak_bytes``, and the estimate (an HBM figure, compared with the
chip's HBM) is compared with it; the OOM rows were already compared with it. On CPU
``total_allocation_bytes`` is ``argument + output - alias + temp`` (the host's
``peak_memory_in_bytes`` is smaller).

The estimate is given the chip's VMEM (``Hardware.vmem_bytes``), the plan's DCN axes and
the chip's ``update_layout_copies`` (see ``cost.memory_estimate``). Result: fits agree
22/22; within 10% of the HBM figure 20/22 (before the VMEM rule and the MLP's
hidden-gradient transient: 14/22; before v6e's transposed update: 19/22). What changed:

- VMEM: where the working set (gradients, saved activations, temporaries) fits in one
  TensorCore's VMEM, the estimate leaves HBM the arguments and 1 MiB (plus, across
  slices, the DCN-reduced gradients and their received copy: the
  ``recv``/``fusion`` buffers of the multi-slice step are HBM buffers). v5e/v6e data8
  ``[1024, 4096, 1024]`` +32%/+35% -> -0%/+1%, v5e fsdp16 x tensor16 batch 4096 +150%
  -> -1%, the 65,536-chip batch 65536 +98% -> +1% (without the 1 MiB remainder it
  would be -15%: the 1 MiB is the 0.7-1.4 MiB of XLA's temp heap seen in all four).
  The v5p data8 ``[2048, 8192, 2048]`` working set (70 MiB) is above one v5p core's
  64 MiB, so it stays counted in HBM, as XLA keeps it (+1%).
- The MLP's widest hidden activation gradient (a matmul output read by two matmuls)
  is now a counted transient: v5e fsdp8 -14% -> -6%; the other MLPs move by 1-9 points
  and stay within 5%.
- v6e's transposed update: v6e data8 ``[49152, 49152]`` -33% -> +0%. JAX writes a
  kernel's gradient as ``dot(dy, x)`` and a transpose; v6e's layout assignment runs the
  first MLP kernel's optimizer update in the transposed ``{0,1}`` layout: the kernel
  shard and each Adam moment are copied to it (``copy`` of
  ``params['layers/0/kernel']``, ``opt_state[0].mu/nu``), updated, and copied back. The
  estimate now takes the larger of the backward peak and that moment: arguments, the
  first kernel's gradient (under fsdp also its whole gradient before the reduce-scatter)
  and the copies (Adam 3, SGD 1), one copy fewer with Adam where three would pass 90% of
  HBM. Evidence: 68 v6e compiles (one at a time, ``XLA_FLAGS=--xla_dump_to``; squares
  4096-73728, rectangles, 2-4 layers, batch 64-65536, data 8/16, fsdp 8/16/256, tensor
  8, data 2 x tensor 4, data 2 x fsdp 4, fsdp 4 x tensor 2, Adam and SGD; two refused,
  compared with XLA's figure; :data:`VARIATIONS`, ``--variations``): within 10% in 16
  before, 55 after; ``fits`` agrees in 68. Exact (< 2%) for every one-layer step whose
  update does not fit VMEM (data or fsdp, SGD too) and across the remat line: three
  copies up to 28.74 GiB of HBM (``[46912, 46912]``), two from 28.78 GiB (``[46976,
  46976]``, the one miss in that band, +17%) up to ``[53248, 53248]``, which XLA refuses
  at 31.69 GiB, six kernels, the estimate's figure too (and, judged on the 31.24 GiB XLA
  makes available, ``Hardware.usable_hbm_bytes``, the estimate refuses it too). v5e and
  v5p (15 compiles, same shapes): never copied; the transformer (stacked layers; v6e
  data 8 and tensor 8): XLA's figure holds no copies (estimate +0%, +10%). The 13 v6e
  misses left: ``[4096, 4096]`` data8 at three batches (-46% to -50%: the update's four
  32 MiB buffers just fill VMEM, the estimate puts them there, XLA keeps three in HBM);
  tensor8 ``[16384] * 3`` (+10%: one of its four 64 MiB buffers goes to VMEM); five
  fsdp8 or fsdp4 x tensor2 ``[8192, 32768, 8192]`` steps (-17% to -20%, SGD too: the
  copies are scheduled during the backward pass, beside its gathered kernels, or the
  collective-matmul loops keep more gathered slots, as on v5e below); two multi-layer
  FSDP steps the whole-gradient moment over-counts (fsdp8 and data2 x fsdp4 ``[16384] *
  3``, +13% and +22%, within 10% without the rule: XLA does not keep that gradient whole
  beside the copies there); data16 ``[8192, 32768, 8192]`` batch 16384 (-10.3%: XLA
  holds one more kernel-sized buffer, likely the second layer's gradient) and the 28.78
  GiB one above.

Where the estimate still misses XLA's HBM figure by more than 10%:

- v5e fsdp4 x tensor2 MLP (-22%): XLA runs the FSDP matmuls as collective-matmul loops
  (collective-permutes in ``while`` loops); its temp heap (768.7 MiB) holds three
  gathered-kernel-sized (256 MiB) slots, where the estimate counts one, and its HBM
  figure (1.19 GiB) is above the peak (1.02 GiB, -9% from the estimate) by the heap's
  packing. (v5e fsdp8, also collective-matmul loops, keeps three hidden-sized buffers
  and five 16 MiB ``custom-call`` outputs beside the 128 MiB gathered kernel at its
  peak; with the hidden gradient counted it is within 10%.) No rule found that holds
  for the other FSDP cases (v6e fsdp16, v5p fsdp16 x tensor4, within 5%);
- the 65,536-chip batch-33554432 MLP (+28%): its working set (177 MiB estimated) is
  above v5e's 128 MiB VMEM, so the rule leaves it in HBM, but memory-space assignment
  still puts part of it in VMEM (99 MiB): at its HBM peak (the backward pass) the batch
  (256 MiB), one output-sized gradient all-reduce (64 MiB) and 24 MiB are live; the
  bf16 cast of the input (64 MiB, counted as a residual) is not among them. Keeping
  only ``working set - VMEM`` in HBM (128 MiB off) would fit it (-9%) but breaks v5e
  fsdp8 (-37%),
  whose buffers (128 MiB gathered kernel, 32 MiB hidden buffers) stay in HBM: which
  buffers of a working set larger than VMEM go there is memory-space assignment's
  heuristic (sizes, uses), not modelled. A per-buffer rule was tried and dropped:
  in every dumped case whose working set is above VMEM (v5e fsdp8, fsdp16 x tensor16
  batch 262144, the 65,536-chip one, v5p data8 and fsdp16 x tensor4, v6e fsdp16 and
  fsdp256) memory-space assignment fills 60-90% of VMEM, with buffers of up to half
  of it (a 32 MiB gradient on v5p, 64 MiB hidden or output buffers on v5e/v6e). Only
  here does the estimate's working set match XLA's HBM + VMEM buffers (177 vs
  180 MiB); elsewhere XLA's total exceeds the estimate's by about what it puts in VMEM
  (HBM less arguments, plus VMEM: v5e fsdp8 394 vs 256 MiB, v5p data8 105 vs 70 MiB;
  collective-matmul windows, extra gradient copies), so any VMEM credit large enough
  here (>= 62 MiB) pushes v5e fsdp8 (room: 15 MiB) and v5p data8 (29 MiB) past -10%
  unless those missing buffers are modelled first. The input's bf16 cast
  is also not materialized here (fused into its consumers, as in fsdp16 x tensor16
  batch 4096), while XLA holds the output's pre-all-reduce matmul result instead;
  the steps with collective-matmul loops do materialize the cast (twice, one copy
  transposed), so that is no general rule either.

Needs libtpu (``jax[tpu]``); without it ``run()`` raises.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MLP_256 = {"kind": "mlp", "features": [8192, 32768, 8192], "dtype": "bfloat16"}
PLAN_256 = {"hardware": "tpu-v5e", "topology": "16x16", "ici": {"fsdp": 16, "tensor": 16},
            "batch_shape": [4096, 8192]}  # fmt: skip


def _tf(layers: int, d: int, f: int, heads: int, vocab: int, seq: int, **kw: Any) -> dict:
    return {"kind": "transformer", "layers": layers, "d_model": d, "d_ff": f, "heads": heads,
            "kv_heads": heads, "vocab": vocab, "seq_len": seq, **kw}  # fmt: skip


def _mlp(*features: int, **kw: Any) -> dict:
    return {"kind": "mlp", "features": list(features), "dtype": "bfloat16", **kw}


# (hardware, topology, slices, ici, dcn, model, global batch)
CASES: list[tuple] = [
    ("tpu-v5e", "2x4", 1, {"data": 8}, None, _mlp(1024, 4096, 1024), 512),
    ("tpu-v5e", "2x4", 1, {"data": 8}, None, _mlp(32768, 32768), 64),
    ("tpu-v5e", "2x4", 1, {"fsdp": 8}, None, _mlp(4096, 16384, 4096), 8192),
    ("tpu-v5e", "2x4", 1, {"fsdp": 4, "tensor": 2}, None, _mlp(8192, 32768, 8192), 4096),
    ("tpu-v5e", "4x4", 1, {"fsdp": 16}, None, _tf(4, 1024, 4096, 8, 32000, 512), 64),
    ("tpu-v5e", "4x4", 1, {"fsdp": 16}, None, _tf(4, 1024, 4096, 8, 32000, 2048), 512),
    ("tpu-v5e", "16x16", 1, {"fsdp": 16, "tensor": 16}, None, MLP_256, 4096),
    ("tpu-v5e", "16x16", 1, {"fsdp": 16, "tensor": 16}, None, MLP_256, 4096 * 64),
    ("tpu-v5e", "16x16", 1, {"data": 256}, None, _mlp(65536, 65536), 256),
    (
        "tpu-v5e",
        "16x16",
        256,
        {"data": 1, "fsdp": 16, "tensor": 16},
        {"data": 256},
        _mlp(4096, 16384, 4096),
        65536,
    ),  # fmt: skip
    (
        "tpu-v5e",
        "16x16",
        256,
        {"data": 1, "fsdp": 16, "tensor": 16},
        {"data": 256},
        _mlp(4096, 16384, 4096),
        65536 * 512,
    ),  # fmt: skip
    ("tpu-v5p", "2x2x2", 1, {"data": 8}, None, _mlp(2048, 8192, 2048), 1024),
    ("tpu-v5p", "2x2x2", 1, {"data": 8}, None, _mlp(98304, 98304), 64),
    ("tpu-v5p", "2x2x2", 1, {"fsdp": 8}, None, _tf(4, 2048, 8192, 16, 32000, 1024), 64),
    ("tpu-v5p", "4x4x4", 1, {"fsdp": 16, "tensor": 4}, None, _mlp(8192, 32768, 8192), 8192),
    ("tpu-v5p", "4x4x4", 1, {"fsdp": 64}, None, _tf(8, 2048, 8192, 16, 32000, 2048), 1024),
    (
        "tpu-v5p",
        "4x4x4",
        1,
        {"fsdp": 64},
        None,
        _tf(8, 2048, 8192, 16, 32000, 2048, remat="full"),
        1024,
    ),  # fmt: skip
    ("tpu-v6e", "2x4", 1, {"data": 8}, None, _mlp(1024, 4096, 1024), 1024),
    ("tpu-v6e", "2x4", 1, {"data": 8}, None, _mlp(49152, 49152), 64),
    ("tpu-v6e", "4x4", 1, {"fsdp": 16}, None, _mlp(8192, 32768, 8192), 16384),
    ("tpu-v6e", "4x4", 1, {"fsdp": 4, "tensor": 4}, None, _tf(4, 2048, 8192, 16, 32000, 1024), 64),
    ("tpu-v6e", "16x16", 1, {"fsdp": 256}, None, _mlp(8192, 32768, 8192), 65536 * 4),
]


_TF_SMALL = _tf(2, 4096, 16384, 32, 32000, 128)

# The transposed-update study: (hardware, topology, ici, features or model, global batch,
# optimizer), one slice; every compile behind the evidence in the module docstring and in
# ``cost.memory_estimate`` (v6e, and the same shapes on v5e and v5p).
VARIATIONS: list[tuple] = [
    ("tpu-v6e", "2x4", {"data": 8}, [49152, 49152], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [32768, 32768], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [8192, 8192], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [4096, 4096], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [49152, 32768], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [32768, 49152], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [49152, 49152], 64, "sgd"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [49152, 49152], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [32768, 32768], 512, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [32768, 32768], 4096, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [32768, 32768], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [8192, 8192], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [32768, 16384], 64, "adam"),
    ("tpu-v5p", "2x2x2", {"data": 8}, [49152, 49152], 64, "adam"),
    ("tpu-v5p", "2x2x2", {"data": 8}, [32768, 32768], 64, "adam"),
    ("tpu-v5p", "2x2x2", {"data": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [1024, 4096, 1024], 1024, "adam"),
    ("tpu-v6e", "4x4", {"fsdp": 16}, [8192, 32768, 8192], 16384, "adam"),
    ("tpu-v6e", "16x16", {"fsdp": 256}, [8192, 32768, 8192], 262144, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [32768, 32768], 64, "sgd"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 4, "tensor": 2}, [16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384], 8192, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384], 16384, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384], 65536, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [1024, 4096, 1024], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [1024, 4096, 1024], 8192, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [8192, 32768, 8192], 512, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [4096, 4096], 2048, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [4096, 4096], 4096, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 8192, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [8192, 16384, 8192], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384, 8192], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [8192, 16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [8192, 8192, 8192, 8192], 64, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [8192, 32768, 8192], 8192, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [8192, 32768, 8192], 64, "adam"),
    ("tpu-v6e", "4x4", {"fsdp": 16}, [8192, 32768, 8192], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [16384, 16384, 16384], 64, "adam"),
    ("tpu-v5e", "2x4", {"fsdp": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [16384, 16384], 64, "sgd"),
    ("tpu-v5p", "2x2x2", {"data": 8}, [16384, 16384, 16384], 64, "adam"),
    ("tpu-v5p", "2x2x2", {"fsdp": 8}, [16384, 16384], 64, "adam"),
    ("tpu-v5p", "2x2x2", {"data": 8}, [49152, 32768], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [16384, 16384], 65536, "adam"),
    ("tpu-v6e", "4x4", {"fsdp": 16}, [8192, 32768, 8192], 1024, "adam"),
    ("tpu-v6e", "4x4", {"fsdp": 16}, [8192, 32768, 8192], 4096, "adam"),
    ("tpu-v6e", "4x4", {"data": 16}, [8192, 32768, 8192], 16384, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [16384, 16384], 8192, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [40960, 40960], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [47104, 47104], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [48128, 48128], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [51200, 51200], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [53248, 53248], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [57344, 57344], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [65536, 65536], 64, "sgd"),
    ("tpu-v6e", "2x4", {"data": 8}, [73728, 73728], 64, "sgd"),
    ("tpu-v6e", "2x4", {"data": 8}, _TF_SMALL, 8, "adam"),
    ("tpu-v6e", "2x4", {"tensor": 8}, _TF_SMALL, 8, "adam"),
    ("tpu-v6e", "2x4", {"tensor": 8}, [16384, 16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 2, "tensor": 4}, [16384, 16384, 16384], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [45056, 45056], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [43008, 43008], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46080, 46080], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [16384, 16384, 16384, 16384], 64, "adam"),
    ("tpu-v5e", "2x4", {"data": 8}, [20480, 20480], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46336, 46336], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46464, 46464], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46592, 46592], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46848, 46848], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46976, 46976], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [47040, 47040], 64, "adam"),
    ("tpu-v6e", "2x4", {"data": 8}, [46912, 46912], 64, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [16384, 16384, 16384], 4096, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [8192, 32768, 8192], 2048, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 4, "tensor": 2}, [8192, 32768, 8192], 4096, "adam"),
    ("tpu-v6e", "4x4", {"fsdp": 16}, [16384, 65536, 16384], 16384, "adam"),
    ("tpu-v6e", "2x4", {"data": 2, "fsdp": 4}, [16384, 16384, 16384], 4096, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [32768, 32768], 512, "adam"),
    ("tpu-v6e", "2x4", {"fsdp": 8}, [8192, 32768, 8192], 8192, "sgd"),
]  # fmt: skip


def _wait(client: Any, location: str) -> dict:
    while True:
        check = client.get(location).json()
        if check["status"] in ("done", "failed", "cancelled"):
            return check
        time.sleep(0.01)


def _end_to_end() -> list[dict[str, Any]]:
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from app.core.settings import Settings  # noqa: PLC0415
    from app.main import create_app  # noqa: PLC0415
    from datarax.hardware.topology import plan_hardware_devices  # noqa: PLC0415
    from datarax.spmd.compile_step import (  # noqa: PLC0415
        abstract_train_step,
        mesh_from_ids,
        tpu_topology_devices,
    )

    class _NoRuntime:
        ready, restarts, pid = False, 0, None

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        def device_info(self) -> None: ...

    layout = plan_hardware_devices("tpu-v5e", topology="16x16", ici=PLAN_256["ici"])
    mesh = mesh_from_ids(tpu_topology_devices("tpu-v5e", "16x16"), layout.device_grid,
                         list(layout.axes))  # fmt: skip
    start = time.perf_counter()
    step = abstract_train_step(MLP_256, mesh, 4096)
    step.jitted().lower(*step.args).compile()
    direct_s = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(db=Path(tmp) / "bench.sqlite", cpu_devices=8)
        with TestClient(create_app(settings, runtime=_NoRuntime())) as client:
            mesh_id = client.post("/v1/meshes", json=PLAN_256).json()["id"]
            url = f"/v1/meshes/{mesh_id}/compile-checks"
            warm = client.post(url, json={"model": _mlp(128, 256, 128)})
            _wait(client, warm.headers["location"])  # the worker started and took libtpu
            start = time.perf_counter()
            answer = client.post(url, json={"model": MLP_256})
            check = _wait(client, answer.headers["location"])
            check_s = time.perf_counter() - start
            assert check["status"] == "done", check
            start = time.perf_counter()
            again = client.post(url, json={"model": MLP_256}).json()
            cached_s = time.perf_counter() - start
            assert again["cached"] is True
    return [
        {"bench": "check_256", "seconds": check_s, "reference_s": direct_s,
         "ratio": check_s / direct_s, "target": "<= 1.2x"},
        {"bench": "cached_repeat", "seconds": cached_s, "target": "< 0.05 s"},
    ]  # fmt: skip


_OOM_FIGURE = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available")


def _oom_bytes(text: str | None) -> int | None:
    """What XLA says a refused program needs, from its ``CompileTimeHbmOom`` text
    (``... (48.13G) exceeds available HBM ...``; G = GiB, two decimals), or ``None``."""
    match = _OOM_FIGURE.search(text or "")
    if not match:
        return None
    return int(float(match.group(1)) * 1024 ** "KMGT".index(match.group(2)) * 1024)


def _estimate_rows() -> list[dict[str, Any]]:
    from datarax.estimate.memory import hardware_memory, memory_estimate  # noqa: PLC0415
    from datarax.hardware.topology import plan_hardware_devices  # noqa: PLC0415
    from datarax.spmd.compile_step import (  # noqa: PLC0415
        compile_train_step,
        mesh_from_ids,
        tpu_topology_devices,
    )

    rows = []
    for hardware, topology, slices, ici, dcn, model, batch in CASES:
        layout = plan_hardware_devices(
            hardware, topology=topology, slices=slices, ici=ici, dcn=dcn,
            allow_split_physical_axes=True,
        )  # fmt: skip
        hbm = layout.hardware.hbm_bytes
        mesh = mesh_from_ids(tpu_topology_devices(hardware, topology, slices),
                             layout.device_grid, list(layout.axes))  # fmt: skip
        est = memory_estimate(
            model, layout.axes, batch, **hardware_memory(layout.hardware),
            dcn_axes=[link.name for link in layout.axes_detail if link.dcn > 1],
        )  # fmt: skip
        xla = compile_train_step(model, mesh, batch, hbm_bytes=hbm)
        peak = xla["memory"]["peak_bytes"] if xla["memory"] else None
        hbm_peak = xla["memory"]["hbm_peak_bytes"] if xla["memory"] else None
        oom = _oom_bytes(xla["xla_error"]) if hbm_peak is None else None
        compared = hbm_peak or oom
        rows.append({
            "bench": "estimate_vs_xla",
            "hardware": hardware,
            "chips": int(mesh.devices.size),
            "axes": layout.axes,
            "model": model["kind"] + (f" {model['features']}" if model["kind"] == "mlp"
                                      else f" L{model['layers']} d{model['d_model']} "
                                           f"S{model['seq_len']} {model.get('remat', 'none')}"),
            "batch": batch,
            "estimate_bytes": est["total"],
            "xla_peak_bytes": peak,
            "xla_hbm_bytes": hbm_peak,
            "xla_oom_bytes": oom,
            "relative": None if not compared else (est["total"] - compared) / compared,
            "estimate_fits": est["fits"],
            "xla_fits": xla["fits"],
            "compile_s": xla["compile_s"],
        })  # fmt: skip
    return rows


def _variation_rows() -> list[dict[str, Any]]:
    """Each of :data:`VARIATIONS` compiled, against the estimate with and without the
    transposed update (``update_layout_copies``)."""
    from datarax.estimate.memory import hardware_memory, memory_estimate  # noqa: PLC0415
    from datarax.hardware.topology import plan_hardware_devices  # noqa: PLC0415
    from datarax.spmd.compile_step import (  # noqa: PLC0415
        compile_train_step,
        mesh_from_ids,
        tpu_topology_devices,
    )

    rows = []
    for hardware, topology, ici, model, batch, optimizer in VARIATIONS:
        if isinstance(model, list):
            model = _mlp(*model)
        layout = plan_hardware_devices(hardware, topology=topology, ici=ici)
        hw = layout.hardware
        mesh = mesh_from_ids(tpu_topology_devices(hardware, topology), layout.device_grid,
                             list(layout.axes))  # fmt: skip
        figures = hardware_memory(hw)
        after = memory_estimate(model, layout.axes, batch, optimizer=optimizer, **figures)
        figures["update_layout_copies"] = False
        before = memory_estimate(model, layout.axes, batch, optimizer=optimizer, **figures)
        xla = compile_train_step(model, mesh, batch, optimizer=optimizer, hbm_bytes=hw.hbm_bytes)
        hbm = xla["memory"]["hbm_peak_bytes"] if xla["memory"] else None
        xla_bytes = hbm or _oom_bytes(xla["xla_error"])
        rows.append({
            "bench": "transposed_update",
            "hardware": hardware,
            "axes": layout.axes,
            "model": (f"mlp {model['features']}" if model["kind"] == "mlp"
                      else f"transformer L{model['layers']} d{model['d_model']}"),
            "batch": batch,
            "optimizer": optimizer,
            "xla_bytes": xla_bytes,
            "xla_refused": hbm is None,
            "before_bytes": before["total"],
            "after_bytes": after["total"],
            "layout_copies": after["layout_copies"],
            "before": None if not xla_bytes else (before["total"] - xla_bytes) / xla_bytes,
            "after": None if not xla_bytes else (after["total"] - xla_bytes) / xla_bytes,
            "fits_agree": after["fits"] == xla["fits"],
        })  # fmt: skip
    return rows


def variations_markdown(rows: list[dict[str, Any]]) -> str:
    """Per generation: how many compiles the estimate is within 10% of, without and with
    the transposed update, and every row still outside."""
    table = [r for r in rows if r["bench"] == "transposed_update"]
    lines = ["| hardware | compiles | within 10% without the rule | with it | fits agree |",
             "|---|---|---|---|---|"]  # fmt: skip
    for hw in sorted({r["hardware"] for r in table}):
        sub = [r for r in table if r["hardware"] == hw and r["after"] is not None]
        lines.append(
            f"| {hw} | {len(sub)} | {sum(abs(r['before']) <= 0.10 for r in sub)} | "
            f"{sum(abs(r['after']) <= 0.10 for r in sub)} | "
            f"{sum(r['fits_agree'] for r in sub)} |"
        )
    lines += ["", "Outside 10% with the rule:", "",
              "| hardware | axes | model | batch | optimizer | XLA GiB | without | with |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    gib = 2**30
    for r in table:
        if r["after"] is not None and abs(r["after"]) > 0.10:
            refused = " (refused)" if r["xla_refused"] else ""
            lines.append(
                f"| {r['hardware']} | {r['axes']} | {r['model']} | {r['batch']} | "
                f"{r['optimizer']} | {r['xla_bytes'] / gib:.3f}{refused} | "
                f"{r['before']:+.0%} | {r['after']:+.0%} |"
            )
    return "\n".join(lines)


def run() -> list[dict[str, Any]]:
    """Every row (see the module docstring)."""
    return _end_to_end() + _estimate_rows() + _variation_rows()


def markdown(rows: list[dict[str, Any]]) -> str:
    """The estimate-vs-XLA table and its agreement figures, as BENCHMARKS.md shows them."""
    table = [r for r in rows if r["bench"] == "estimate_vs_xla"]
    if not table:
        return variations_markdown(rows)
    lines = ["| hardware | chips | axes | model | batch | estimate GiB | XLA HBM GiB | "
             "XLA peak (HBM + VMEM) GiB | rel. error (vs HBM) | fits est / XLA |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    gib = 2**30
    for r in table:
        if r.get("xla_hbm_bytes") is not None:
            xla = f"{r['xla_hbm_bytes'] / gib:.3f}"
        elif r.get("xla_oom_bytes"):
            xla = f"OOM, needs {r['xla_oom_bytes'] / gib:.2f}"
        else:
            xla = "OOM"
        peak = "-" if r["xla_peak_bytes"] is None else f"{r['xla_peak_bytes'] / gib:.3f}"
        rel = "-" if r["relative"] is None else f"{r['relative']:+.0%}"
        lines.append(
            f"| {r['hardware']} | {r['chips']} | {r['axes']} | {r['model']} | {r['batch']} | "
            f"{r['estimate_bytes'] / gib:.3f} | {xla} | {peak} | {rel} | "
            f"{r['estimate_fits']} / {r['xla_fits']} |"
        )
    agree = sum(r["estimate_fits"] == r["xla_fits"] for r in table)
    compared = [r for r in table if r["relative"] is not None]
    within = sum(abs(r["relative"]) <= 0.10 for r in compared)
    lines.append("")
    lines.append(f"fits agree: {agree}/{len(table)}; memory within 10%: {within}/{len(compared)}")
    for r in rows:
        if r["bench"] in ("check_256", "cached_repeat"):
            lines.append(f"{r['bench']}: {json.dumps(r)}")
    if any(r["bench"] == "transposed_update" for r in rows):
        lines += ["", "v6e's transposed update (``VARIATIONS``: the same estimate without and "
                  "with ``update_layout_copies``, against XLA's HBM figure):", "",
                  variations_markdown(rows)]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--table-only", action="store_true", help="the table's cases only")
    parser.add_argument("--variations", action="store_true", help="the VARIATIONS only")
    args = parser.parse_args()
    if args.variations:
        rows = _variation_rows()
    else:
        rows = _estimate_rows() if args.table_only else run()
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
