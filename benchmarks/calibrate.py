"""Calibrates and validates ``step_s`` on published measured training runs.

Each run of :mod:`benchmarks.calibration_runs` is planned as a request would plan it
(``plan_hardware_devices`` with its hardware, topology or hosts, slices, ici and dcn) and
estimated (``estimate_step``); its uncalibrated parts (``step_time.step_components``) are
then combined with candidate constants. The constants of each published calibration
profile (accelerator kind and software stack: ``published-tpu-jax``, ``published-gpu-jax``,
``published-gpu-pytorch``; :func:`profile_of`) are fitted by a grid search that
minimises the mean absolute relative error on the training rows;
every third run of each source-and-hardware group is held out and never
seen by the fit. A second check leaves out one whole source at a time (all its rows),
fits on the rest and reports the error on the source left out.

Run: ``python -m benchmarks.calibrate`` (prints the table and the fit as markdown;
``--json PATH`` also writes the rows). ``make bench`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks.calibration_runs import OOM_BOUNDARIES, RUNS  # noqa: E402
from datarax.errors import PlanError  # noqa: E402
from datarax.estimate.calibrations import fit_constants  # noqa: E402
from datarax.estimate.cost import estimate_step  # noqa: E402
from datarax.estimate.step_time import PUBLISHED_CONSTANTS, Calibration, combine  # noqa: E402
from datarax.hardware.chips import get_hardware  # noqa: E402
from datarax.hardware.topology import plan_hardware_devices  # noqa: E402


def measured_step(run: Mapping[str, Any]) -> float:
    """The run's measured step in seconds (logged, or from its tokens/s or TFLOP/s)."""
    m = run["measured"]
    return float(m.get("step_s") or m["derived_step_s"])


def group_of(run: Mapping[str, Any]) -> str:
    """The run's source family: ``maxtext``, ``tpu-recipes``, ``torchtitan``, ``megatron``."""
    source = run["source"]
    for name in ("tpu-recipes", "gpu-recipes", "JAX-Toolbox", "torchtitan", "Megatron-LM",
                 "maxtext"):  # fmt: skip
        if name in source:
            return name.lower()
    return source.split("/")[1]


_PYTORCH_SOURCES = ("torchtitan", "megatron-lm")


def profile_of(run: Mapping[str, Any]) -> str:
    """The published calibration profile the run's constants belong to:
    ``published-<kind>-<framework>`` (the run's ``framework``, else ``pytorch`` for
    torchtitan and Megatron-LM and ``jax`` for the rest)."""
    framework = run.get("framework") or ("pytorch" if group_of(run) in _PYTORCH_SOURCES else "jax")
    return f"published-{get_hardware(run['hardware']).kind}-{framework}"


def held_out(runs: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every third run (by id) of each (source, hardware) group, and the runs marked
    ``held_out`` (checks from sources the fit may not use)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        groups.setdefault((group_of(run), run["hardware"]), []).append(run["id"])
    out = {run["id"] for run in runs if run.get("held_out")}
    for ids in groups.values():
        out.update(sorted(ids)[2::3])
    return out


MAXTEXT_ORDER = ("data", "fsdp", "tensor")


def mesh_axes(run: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """``(ici, dcn)`` over every axis either names, in MaxText's mesh order (an axis one
    network leaves out is 1 there, as MaxText's ``ici_*``/``dcn_*`` defaults are)."""
    ici, dcn = run["ici"], run.get("dcn") or {}
    names = [a for a in MAXTEXT_ORDER if a in ici or a in dcn]
    return {a: int(ici.get(a, 1)) for a in names}, {a: int(dcn.get(a, 1)) for a in names}


def components(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run's uncalibrated step parts and the estimate's memory verdict."""
    hw = get_hardware(run["hardware"])
    ici, dcn = mesh_axes(run)
    layout = plan_hardware_devices(
        hw,
        ici=ici,
        dcn=dcn,
        topology=run.get("topology"),
        slices=int(run.get("slices") or 1),
        hosts=run.get("hosts"),
        allow_split_physical_axes=True,
    )
    est = estimate_step(hw, layout.axes_detail, run["model"], int(run["global_batch"]))
    mem = est.memory_per_device
    return {
        "kind": hw.kind,
        "parts": est.predicted_components,
        "devices": int(layout.device_ids.size),
        "fits": mem["fits"],
        "total_gib": mem["total"] / 2**30,
        "roofline_s": est["roofline_s"],
    }


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def fit(rows: Iterable[Mapping[str, Any]], base: Calibration) -> Calibration:
    """The grid point with the least mean absolute relative error on ``rows``
    (:func:`datarax.estimate.calibrations.fit_constants`, the library's own fit)."""
    return fit_constants([(r["parts"], r["measured"]) for r in rows], base)


def mae(rows: Sequence[Mapping[str, Any]], cal: Calibration) -> float:
    if not rows:
        return float("nan")
    return sum(abs(error(combine(r["parts"], cal)["step_s"], r["measured"])) for r in rows) / len(
        rows
    )


def _base(profile: str) -> Calibration:
    """The shipped constants of ``profile`` (the fit's fixed ``overhead_s`` and its
    mixture-of-experts constants), or neutral ones for a profile that ships none yet."""
    return PUBLISHED_CONSTANTS.get(profile) or Calibration(0.5, 0.5, 0.9, 0.5, 0.0, "unfitted")


def study() -> dict[str, Any]:
    """Rows, fitted constants and errors (training, held out, leave-one-source-out)."""
    holdout = held_out(RUNS)
    rows, skipped = [], []
    for run in RUNS:
        try:
            parts = components(run)
        except PlanError as refused:  # a slice shape the catalog does not take
            skipped.append((run["id"], str(refused)))
            continue
        row = {"run": run, "measured": measured_step(run), **parts}
        row["held_out"] = run["id"] in holdout
        row["group"] = group_of(run)
        row["profile"] = profile_of(run)
        rows.append(row)
    fitted = {}
    for profile in sorted({r["profile"] for r in rows}):
        train = [r for r in rows if r["profile"] == profile and not r["held_out"]]
        fitted[profile] = replace(
            fit(train, _base(profile)),
            source=f"fitted by benchmarks/calibrate.py on {len(train)} training rows",
        )
    for row in rows:
        cal = fitted[row["profile"]]
        row["predicted"] = combine(row["parts"], cal)["step_s"]
        row["shipped"] = combine(row["parts"], _base(row["profile"]))["step_s"]
        row["error"] = error(row["predicted"], row["measured"])
        row["shipped_error"] = error(row["shipped"], row["measured"])
    lolo = {}
    for group in sorted({r["group"] for r in rows}):
        rest = [r for r in rows if r["group"] != group]
        left = [r for r in rows if r["group"] == group]
        errs = []
        for profile in {r["profile"] for r in left}:
            cal = fit([r for r in rest if r["profile"] == profile], _base(profile))
            errs += [abs(error(combine(r["parts"], cal)["step_s"], r["measured"])) for r in left
                     if r["profile"] == profile]  # fmt: skip
        lolo[group] = (sum(errs) / len(errs), len(errs))
    boundaries = []
    for run in OOM_BOUNDARIES:
        verdict = components(run)
        boundaries.append(
            {"id": run["id"], "published_fits": run["fits"], "estimate_fits": verdict["fits"],
             "total_gib": verdict["total_gib"], "notes": run.get("notes", "")}
        )  # fmt: skip
    return {
        "rows": rows,
        "fitted": fitted,
        "leave_one_source_out": lolo,
        "skipped": skipped,
        "boundaries": boundaries,
    }


def profile_errors(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per fitted profile: the training and held-out rows' mean absolute errors (rounded
    as ``step_time.PUBLISHED_ERRORS`` ships them) and their counts."""
    out = {}
    for profile in sorted(result["fitted"]):
        rows = [r for r in result["rows"] if r["profile"] == profile]
        train = [abs(r["error"]) for r in rows if not r["held_out"]]
        held = [abs(r["error"]) for r in rows if r["held_out"]]
        out[profile] = {
            "training_mae": round(sum(train) / len(train), 3) if train else None,
            "training_runs": len(train),
            "held_out_mae": round(sum(held) / len(held), 3) if held else None,
            "held_out_runs": len(held),
        }
    return out


def summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """The headline figures: mean absolute errors of training and held-out rows."""
    rows = result["rows"]

    def mean_abs(selected: Sequence[Mapping[str, Any]], key: str = "error") -> float:
        return sum(abs(r[key]) for r in selected) / len(selected) if selected else float("nan")

    held = [r for r in rows if r["held_out"]]
    return {
        "runs": len(rows),
        "held_out_runs": len(held),
        "train_mae": mean_abs([r for r in rows if not r["held_out"]]),
        "held_out_mae": mean_abs(held),
        "held_out_mae_shipped": mean_abs(held, "shipped_error"),
        "fits_false": [r["run"]["id"] for r in rows if r["fits"] is not True],
        "fitted": {
            k: [v.matmul, v.attention, v.hbm, v.overlap] for k, v in result["fitted"].items()
        },
    }


def _summary(rows: Sequence[Mapping[str, Any]], key: str) -> str:
    if not rows:
        return "n/a"
    errs = [abs(r[key]) for r in rows]
    return f"{sum(errs) / len(errs):.1%} over {len(rows)} runs (worst {max(errs):.0%})"


def markdown(result: Mapping[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "| run | hardware | devices | mesh (ici / dcn) | model | batch | measured s | "
        "predicted s | error | roofline s | fits | set | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["held_out"], r["run"]["id"])):
        run = r["run"]
        m = run["model"]
        model = f"{m['layers']}L d{m['d_model']} f{m['d_ff']} s{m['seq_len']} {m.get('remat')}"
        mesh = f"{json.dumps(run['ici'])} / {json.dumps(run.get('dcn') or {})}"
        lines.append(
            f"| {run['id']} | {run['hardware']} | {r['devices']} | {mesh} | {model} | "
            f"{run['global_batch']} | {r['measured']:.3g} | {r['predicted']:.3g} | "
            f"{r['error']:+.0%} | {r['roofline_s']:.3g} | {r['fits']} | "
            f"{'held out' if r['held_out'] else 'fit'} | {run['source'].split(' ')[0]} |"
        )
    out = ["\n".join(lines), ""]
    for profile, cal in result["fitted"].items():
        out.append(
            f"- fitted {profile}: matmul {cal.matmul:.2f}, flash attention {cal.attention:.2f}, "
            f"HBM {cal.hbm:.2f}, overlap {cal.overlap:.1f} ({cal.source})"
        )
    for profile in result["fitted"]:
        of = [r for r in rows if r["profile"] == profile]
        train = _summary([r for r in of if not r["held_out"]], "error")
        out.append(
            f"- {profile}: training rows {train}; "
            f"held-out rows {_summary([r for r in of if r['held_out']], 'error')}"
        )
    held = [r for r in rows if r["held_out"]]
    out.append(
        f"- all held-out rows: {_summary(held, 'error')}; "
        f"with the shipped constants: {_summary(held, 'shipped_error')}"
    )
    for group, (err, n) in result["leave_one_source_out"].items():
        out.append(
            f"- leave {group} out ({n} runs), fit on the rest: {err:.1%} mean absolute error"
        )
    agree = [b for b in result["boundaries"] if b["published_fits"] == b["estimate_fits"]]
    out.append(
        f"- published fit/out-of-memory boundaries (`OOM_BOUNDARIES`): the estimate agrees "
        f"in {len(agree)} of {len(result['boundaries'])}"
        + "".join(
            f"; {b['id']}: published {'fits' if b['published_fits'] else 'OOM'}, estimate "
            f"{b['total_gib']:.1f} GiB"
            for b in result["boundaries"]
            if b not in agree
        )
    )
    for run_id, why in result["skipped"]:
        out.append(f"- not planned: {run_id}: {why}")
    fits = [r for r in rows if r["fits"] is not True]
    out.append(f"- runs the estimate calls out of memory: {len(fits)} of {len(rows)}"
               + (": " + ", ".join(r["run"]["id"] for r in fits) if fits else ""))  # fmt: skip
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    result = study()
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "rows": [
                        {k: v for k, v in r.items() if k not in ("parts",)} for r in result["rows"]
                    ],
                    "fitted": {k: vars(v) for k, v in result["fitted"].items()},
                },
                out,
                indent=1,
                default=str,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
