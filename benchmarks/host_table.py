"""The markdown table of :mod:`benchmarks.host_calibration`'s results, with no JAX (so
``benchmarks.run`` renders kept results without starting a backend)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _mae(rows: Sequence[dict[str, Any]], key: str) -> float:
    done = [r for r in rows if r.get(key) is not None]
    return sum(abs(r[key]) for r in done) / max(len(done), 1)


def markdown(result: dict[str, Any]) -> str:
    c = result["constants"]
    where = f"{result.get('devices', 8)} x {result.get('device_kind', 'cpu')}"
    if "link" in c:  # measured since the collectives and the overlap were fitted
        links = (
            f", collectives at {c['link']:.3f} of the catalog's link and "
            f"{c['collective_s'] * 1e3:.2f} ms an op, {c.get('layer_s', 0.0) * 1e3:.2f} ms a "
            f"layer, overlap {c['overlap']} (the smaller of the measured and the published "
            "profile's)."
        )
    else:
        links = f" (overlap {c['overlap']}, the published profile's)."
    lines = [
        f"Host calibration: {result['calibration_s']:.1f} s (every stage, {where}). "
        f"Constants: matmul {c['matmul']:.3f}, attention {c['attention']:.3f}, hbm "
        f"{c['hbm']:.3f}, overhead {c['overhead_s'] * 1e3:.2f} ms{links}",
        "",
        "| model (layers x d_model, seq, batch, remat) | measured s | host profile s | error "
        f"| {result.get('published', 'published-cpu-jax')} s | error | memory vs XLA |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        s = r["size"]
        remat = s.get("remat", "none")
        name = f"{s['layers']} x {s['d_model']}, {s['seq_len']}, {s['batch']}, {remat}"
        if "failed" in r:
            lines.append(f"| {name} | {r['failed']} | | | | | |")
            continue
        mem = "" if r.get("memory_error") is None else f"{r['memory_error']:+.1%}"
        lines.append(
            f"| {name} | {r['measured_s']:.3f} | {r['host_s']:.3f} | {r['host_error']:+.1%} | "
            f"{r['published_s']:.3f} | {r['published_error']:+.1%} | {mem} |"
        )
    lines += [
        "",
        f"Mean absolute error: host profile {_mae(result['rows'], 'host_error'):.1%}, "
        f"{result.get('published', 'published-cpu-jax')} "
        f"{_mae(result['rows'], 'published_error'):.1%}.",
    ]
    return "\n".join(lines)
