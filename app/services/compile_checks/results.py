"""What a compile check answers: ``fits`` judged here against the target's memory
(:func:`judge_fits`), and the memory estimate against XLA's figures (:func:`estimate_error`)."""

from __future__ import annotations

from typing import Any


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} PiB"  # pragma: no cover - the loop returns


def judge_fits(result: dict[str, Any], hbm_bytes: int | None, source: str | None) -> dict[str, Any]:
    """``result`` with ``fits`` and ``fits_reason`` decided here, never by default.

    - XLA refused the program for memory (``xla_error``): ``fits`` false.
    - a memory bound (``hbm_bytes``, from ``source``): ``fits`` is XLA's
      ``hbm_peak_bytes`` (else ``peak_bytes``) against it.
    - no bound (a GPU without ``bytes_limit`` nor a catalog entry, a host whose memory is
      unknown): ``fits`` is ``None`` (JSON null, unknown), never true by default.

    ``fits_reason`` says which, with the figures.
    """
    out = dict(result)
    if out.get("xla_error"):
        out["fits"] = False
        out["fits_reason"] = "XLA refused the program for memory at compile time (xla_error)"
        return out
    memory = out.get("memory") or {}
    peak = memory.get("hbm_peak_bytes") or memory.get("peak_bytes")
    if peak is None or hbm_bytes is None:
        out["fits"] = None
        out["fits_reason"] = (
            "unknown: there is no memory figure for this target to compare XLA's peak "
            "with (set DATARAX_MEMORY_BUDGET_MB to give one)"
            if peak is not None
            else "unknown: XLA reported no memory figures"
        )
        return out
    fits = peak <= hbm_bytes
    out["fits"] = fits
    out["fits_reason"] = (
        f"XLA's peak of {_size(peak)} per device is {'within' if fits else 'beyond'} the "
        f"{_size(hbm_bytes)} per device available ({source})"
    )
    return out


def estimate_error(estimate: dict[str, Any] | None, result: dict[str, Any]) -> Any:
    """The estimate against XLA, field by field: ``{field: {"estimate", "xla",
    "relative"}}`` with ``relative = (estimate - xla) / xla``, and ``fits_agrees``.

    A serving plan's ``estimate`` is its ``memory_per_device``: ``argument_bytes`` is
    weights + kv_cache (what the decode step takes in) and ``hbm_peak_bytes`` its total.

    Fields: ``argument_bytes`` (estimate: params + optimizer + batch, what the step takes
    in), ``temp_bytes`` (grads + activations + temporaries, what it makes),
    ``peak_bytes`` (total, against XLA's peak, which on TPU also counts on-chip VMEM) and
    ``hbm_peak_bytes`` (total, against XLA's HBM allocation, what ``fits`` is judged on
    and the estimate models).
    """
    known = estimate is not None and None not in (estimate.get("fits"), result.get("fits"))
    if not estimate or not result.get("memory"):
        if known and estimate is not None:
            return {"fits_agrees": estimate["fits"] == result["fits"]}
        return None
    mem = result["memory"]
    if "kv_cache" in estimate:  # a serving plan's memory against its decode step
        pairs = {
            "argument_bytes": estimate["weights"] + estimate["kv_cache"],
            "hbm_peak_bytes": estimate["total"],
        }
    else:
        pairs = {
            "argument_bytes": estimate["params"] + estimate["optimizer"] + estimate["batch"],
            "temp_bytes": estimate["grads"]
            + estimate["activations"]
            + estimate.get("temporaries", 0),
            "peak_bytes": estimate["total"],
            "hbm_peak_bytes": estimate["total"],
        }
    out: dict[str, Any] = {}
    for name, est in pairs.items():
        xla = mem.get(name)
        if xla is None:  # a result cached before hbm_peak_bytes
            continue
        out[name] = {
            "estimate": est,
            "xla": xla,
            "relative": None if not xla else (est - xla) / xla,
        }
    if known:
        out["fits_agrees"] = estimate["fits"] == result["fits"]
    return out
