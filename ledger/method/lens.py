"""The effective-compute lens of "ipledger-attribution" 1.1 (docs/method.md, "Effective compute").

Beside the time identity (which 1.1 leaves exactly as 1.0 computes it), the lens says how much math each
covered GPU-second did against the device's rating. Per sample, with the covered time ``c`` and the clock ratio
``r`` the time identity already uses:

* ``tensor_gpu_hours`` = Σ c × tensor_active × r, and likewise ``fp64/fp32/fp16_gpu_hours`` from DCGM's pipe
  fields (1006-1008) where they were measured;
* ``achieved_pflop_hours`` = Σ c × tensor_active × r × peak and ``rated_pflop_hours`` = Σ c × peak over the
  same samples (peak: the SKU's dense PFLOPS at the run's precision, a MIG slice at its share), and their ratio
  ``rated_share``;
* the bound split of delivered time (c × activity × r): compute / memory / latency / other;
* ``unmeasured_gpu_hours``: covered time of samples without the needed field (tensor active) — unknown, never
  read as zero; a device with only a summary or coarse utilisation contributes nothing else.

Pure and vectorised: :func:`lens_device` is what receipts use; :func:`lens_device_reference` is the same
definition as a plain loop (exact sums, math.fsum), held equal to it within a nanohour by tests/test_lens.py.
Sums are kept in seconds and rounded to whole nanohours once per device, so a device's figures are the same in
every process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .attribution import (DEFAULT_THRESHOLDS, NANOHOURS_PER_SECOND, CoveredSamples, SampleArrays, Thresholds,
                          attribute_device_covered)

LENS_METHOD_VERSION = "1.1.0"
# 1.2.0: 1.1.0 plus the FP32 and FP64 pipes in the achieved FLOPs (each at the SKU's non-tensor peak) and the
# block's ``flops_source``; 1.1.0 receipts keep computing exactly as 1.1.0 did
PIPES_METHOD_VERSION = "1.2.0"
LENS_METHOD_VERSIONS = (LENS_METHOD_VERSION, PIPES_METHOD_VERSION)
FLOPS_SOURCES = ("op_counters", "activity", "mixed", "unmeasured")
# the pipes whose activity counts toward achieved FLOPs under 1.2.0, and the SKU's non-tensor peak each uses
# (FP16 has no non-tensor peak in the vendors' data sheets: its pipe is reported, never priced as math)
PIPE_PEAKS = {"fp32": "peak_fp32_tflops", "fp64": "peak_fp64_tflops"}
PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "fp64")
BOUNDS = ("compute", "memory", "latency", "other")
PIPES = ("fp64", "fp32", "fp16")


@dataclass(frozen=True)
class LensThresholds:
    """What counts as "high" for the bound split (part of method 1.1: changing one changes its version)."""

    pipe_high: float = 0.3        # tensor or any FP pipe at or above this: compute-bound
    dram_high: float = 0.3        # DRAM active at or above this (pipes low): memory-bound
    sm_high: float = 0.5          # SM active at or above this ...
    occupancy_low: float = 0.2    # ... with occupancy below this (pipes and DRAM low): latency-bound


DEFAULT_LENS_THRESHOLDS = LensThresholds()


@dataclass(frozen=True)
class LensSettings:
    """Method 1.1's effective-compute lens is on; ``compute_precision`` as the site gives it (one name, or a
    table by account or SKU key with a ``default``)."""

    compute_precision: Any = "bf16"
    version: str = LENS_METHOD_VERSION   # 1.1.0, or 1.2.0 (the FP pipes in the achieved FLOPs)

    def __post_init__(self) -> None:
        if self.version not in LENS_METHOD_VERSIONS:
            raise ValueError(f"method_version: {self.version!r} is not a lens version "
                             f"({', '.join(LENS_METHOD_VERSIONS)})")


@dataclass
class DeviceLens:
    """One device's lens in seconds (floats, exact sums) and, for the receipt, whole nanohours."""

    tensor_s: float = 0.0
    pipes_s: dict[str, float | None] = field(default_factory=lambda: {p: None for p in PIPES})
    # Σ c × pipe × r over samples without an op count (what 1.2.0 prices at the pipe's peak); None: not measured
    pipes_uncounted_s: dict[str, float | None] = field(default_factory=lambda: {p: None for p in PIPES})
    measured_s: float = 0.0               # covered seconds with tensor active measured
    counted_flop: float = 0.0             # operations the op counters counted in covered time (c / dt of each)
    counted_s: float = 0.0                # covered seconds with an op count
    tensor_uncounted_s: float = 0.0       # Σ c × tensor × r over samples with tensor active but no op count
    rated_s: float = 0.0                  # covered seconds with either (the rated figure's time)
    unmeasured_s: float = 0.0             # covered seconds without it
    delivered_s: float = 0.0              # Σ c × activity × r over working samples (the bound split's whole)
    bound_s: dict[str, float] = field(default_factory=lambda: {b: 0.0 for b in (*BOUNDS, "unmeasured")})

    def nanohours(self, seconds: float | None) -> int | None:
        return None if seconds is None else int(math.floor(seconds * NANOHOURS_PER_SECOND + 0.5))


def _sum(x: np.ndarray, mask: np.ndarray | None = None, scratch: np.ndarray | None = None) -> float:
    """Σ x over the mask, x finite: the sum of x × mask (numpy's pairwise sum: the same order, so the same
    float, in every process; ``scratch``, an array like x, holds the product). A mask of every sample or of
    none changes no term, so it is left out."""
    if mask is None:
        return float(_add(x))
    k = int(_count(mask))
    if k == 0:
        return 0.0
    return float(_add(x)) if k == mask.shape[0] else float(_add(np.multiply(x, mask, out=scratch)))


_add, _count = np.add.reduce, np.count_nonzero


def _unit(x: np.ndarray) -> np.ndarray:
    """x clipped to [0, 1], unmeasured (NaN) as 0 (fmax drops the NaN)."""
    out = np.fmax(x, 0.0)
    return np.fmin(out, 1.0, out=out)


# 1.0's bit pattern: a float64's bits read as an unsigned integer lie at or below it exactly where the value lies in
# [+0.0, 1.0] (every negative value, -0.0, and every NaN has a larger pattern; larger positive values too)
_ONE_BITS = int(np.float64(1.0).view(np.uint64))


def _in_unit(x: np.ndarray) -> float | None:
    """x's largest value where every value lies in [0, 1] (so clipping it changes nothing and no sample is
    unmeasured), else None: :func:`_in_unit_reference`'s answer. One reduction where every value lies in
    [+0.0, 1.0] (the largest bit pattern read as an unsigned integer is the largest value's); anything else (a
    -0.0, a NaN, a value outside) is answered by the reference. The speed trick of :func:`lens_device` (the clip
    it spares is the plain way, kept for the rest)."""
    if not x.shape[0]:
        return None
    if x.dtype == np.float64:
        bits = int(x.view(np.uint64).max())
        if bits <= _ONE_BITS:
            return float(np.array(bits, dtype=np.uint64).view(np.float64))
    return _in_unit_reference(x)


def _in_unit_reference(x: np.ndarray) -> float | None:
    """:func:`_in_unit` in two reductions (a NaN makes both NaN, and NaN compares false)."""
    if not x.shape[0]:
        return None
    lo, hi = float(x.min()), float(x.max())
    return hi if lo >= 0.0 and hi <= 1.0 else None


def _pipe_sum(v: np.ndarray, cr: Callable[[], np.ndarray], buf: np.ndarray
              ) -> tuple[float, np.ndarray, float | None]:
    """Σ clip(v, 0, 1) × cr, unmeasured (NaN) terms 0, clip(v) (``v`` itself, never written, where clipping
    changes nothing; else in ``buf``) and v's largest value where every sample measured it within [0, 1]
    (None otherwise). ``cr`` gives c × r, computed once it is first asked for. Where every value lies in
    [0, 1] the clip is v and the sum one pass (``einsum``, numpy's own loop, no BLAS), and a pipe of zeros
    sums to 0 without one (nor c × r); else clip, then the sum of products; a NaN in that result means some
    sample did not measure it, and the terms are taken again with NaN as 0."""
    hi = _in_unit(v)
    if hi is not None:
        return (0.0 if hi == 0.0 else float(np.einsum("i,i->", v, cr()))), v, hi
    vc = np.clip(v, 0.0, 1.0, out=buf)
    s = float(np.einsum("i,i->", vc, cr()))
    if s != s:
        vc = np.fmin(np.fmax(v, 0.0, out=buf), 1.0, out=buf)
        s = float(np.einsum("i,i->", vc, cr()))
    return s, vc, None


def _measured(x: np.ndarray | None, order: np.ndarray | slice) -> np.ndarray | None:
    """A lens field in time order, or None where no sample measured it (the same sums as a column of NaN)."""
    if x is None:
        return None
    x = x[order]
    if x.shape[0] and x[0] == x[0]:   # the usual case: the first sample measured it (no pass over the rest)
        return x
    return x if bool(np.any(x == x)) else None


def lens_device(window: tuple[float, float], samples: SampleArrays | None, *,
                unknown: Sequence[tuple[float, float, str]] = (), suspended: Sequence[tuple[float, float]] = (),
                rated_clock_mhz: float | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS,
                lens: LensThresholds = DEFAULT_LENS_THRESHOLDS, covered: CoveredSamples | None = None
                ) -> DeviceLens:
    """One device's effective-compute lens from its samples (None or empty: nothing measured, nothing known).

    ``covered``: the per-sample figures the attribution of the same samples, window, spans, rated clock and
    thresholds computed (:func:`ledger.method.attribution.attribute_device_covered` hands them to this inside
    its pass, so the receipt attributes and reads the lens at once); without it the lens runs that pass."""
    if samples is None or not len(samples):
        return DeviceLens()
    if covered is None:
        return attribute_device_covered(window, samples, unknown=unknown, suspended=suspended,
                                        rated_clock_mhz=rated_clock_mhz, thresholds=thresholds,
                                        use=lens_reader(samples, lens))[1]
    out = DeviceLens()
    order, c, r = covered.order, covered.covered, covered.ratio
    n = c.shape[0]
    ten = samples.tensor[order]
    if _in_unit(ten) is not None:     # the usual case: every sample measured it, in [0, 1] (the clip is ten)
        has_t, no_t = None, None
        hot = ten >= lens.pipe_high   # compute-bound by tensor activity
        ctr = np.multiply(ten, c)
    else:
        has_t = ten == ten
        no_t = None if int(np.count_nonzero(has_t)) == n else ~has_t
        ctr = _unit(ten)
        hot = ctr >= lens.pipe_high   # compute-bound by tensor activity (unmeasured: 0, never high ...)
        if lens.pipe_high <= 0:
            hot &= has_t              # ... unless "high" starts at 0)
        ctr *= c
    if r is not None:
        ctr *= r
    out.tensor_s = _sum(ctr)          # (0 where tensor active was not measured)
    if no_t is None:                  # (every sample measured: the sum over all, and over none 0.0)
        out.measured_s = float(c.sum())
    else:
        out.measured_s, out.unmeasured_s = _sum(c, has_t), _sum(c, no_t)
    out.tensor_uncounted_s = out.tensor_s
    out.rated_s = out.measured_s
    uncounted = None                  # samples without an op count (None: every sample)
    ops = _measured(samples.ops, order)
    if ops is not None:  # counted, not inferred: the share of the sample's count that falls in its covered time
        dts = samples.dt[order]
        has_o = (ops == ops) & (dts > 0)
        if has_o.any():
            out.counted_flop = _sum(np.maximum(np.where(has_o, ops, 0.0), 0.0) * c / np.where(has_o, dts, 1.0),
                                    has_o)
            out.counted_s = _sum(c, has_o)
        out.tensor_uncounted_s = _sum(ctr, ~has_o if has_t is None else has_t & ~has_o)
        out.rated_s = out.measured_s if has_t is None else _sum(c, has_t | has_o)
        uncounted = ~has_o
    scratch = ctr                     # (free from here: each masked sum's product goes there)
    known_any = has_t if no_t is not None else None
    products: list[np.ndarray] = []       # c × r, once a pipe asks for it (a pipe of zeros does not)

    def cr() -> np.ndarray:
        if not products:
            products.append(c if r is None else c * r)
        return products[0]

    top, owned = None, False                  # the highest pipe of each sample (fmax: NaN where none measured)
    for p in PIPES:
        v = _measured(getattr(samples, p), order)
        if v is None:
            continue
        out.pipes_s[p], vc, hi = _pipe_sum(v, cr, ctr)   # (0 where the pipe was not measured)
        out.pipes_uncounted_s[p] = out.pipes_s[p] if uncounted is None else \
            _sum(np.multiply(vc, cr(), out=ctr), uncounted)   # (op counters read: the uncounted samples')
        if hi is not None and hi < lens.pipe_high:
            continue                          # (no sample of this pipe is high: it cannot change the test)
        if top is None:
            top = v                           # (the samples' own array: never written)
        else:
            top, owned = np.fmax(top, v, out=top if owned else None), True
    if top is not None:
        if lens.pipe_high > 0:   # top ≥ high on the raw values is the clipped values' test (NaN: false)
            high = top >= lens.pipe_high
        else:
            high = (_unit(top) >= lens.pipe_high) & (top == top)
        hot |= high
        if known_any is not None:
            known_any = known_any | high
    # The bound split over delivered time: working samples (activity measured and at least active_min), each
    # in one part; delivered time is the sum of the parts.
    working, deliv = covered.working, covered.delivered
    compute = working & hot
    out.bound_s["compute"] = _sum(deliv, compute, scratch)
    settled = compute                 # samples given a bound so far
    dram = _measured(samples.dram, order)
    if dram is not None:
        if known_any is not None:
            known_any = known_any | (dram == dram)
        memory = working & (dram >= lens.dram_high)   # (NaN compares false)
        memory &= ~settled
        out.bound_s["memory"] = _sum(deliv, memory, scratch)
        settled = settled | memory
    occ = _measured(samples.occupancy, order)
    if occ is not None:
        if known_any is not None:
            known_any = known_any | (occ == occ)
        latency = working & (samples.sm[order] >= lens.sm_high) & (occ < lens.occupancy_low)  # (NaN: false)
        latency &= ~settled
        out.bound_s["latency"] = _sum(deliv, latency, scratch)
        settled = settled | latency
    if known_any is not None:
        unmeasured = working & ~known_any
        out.bound_s["unmeasured"] = _sum(deliv, unmeasured, scratch)
        settled = settled | unmeasured
    out.bound_s["other"] = _sum(deliv, working ^ settled, scratch)   # (settled lies inside working)
    out.delivered_s = math.fsum(out.bound_s.values())
    return out


def lens_reader(samples: SampleArrays, lens: LensThresholds = DEFAULT_LENS_THRESHOLDS
                ) -> Callable[[CoveredSamples], DeviceLens]:
    """``use`` for :func:`ledger.method.attribution.attribute_device_covered`: the device's lens, read in the
    attribution's pass over these samples (the window, spans, clock and thresholds are the attribution's)."""
    return lambda covered: lens_device((0.0, 0.0), samples, lens=lens, covered=covered)


def lens_device_reference(window: tuple[float, float], samples: SampleArrays | None, *,
                          unknown: Sequence[tuple[float, float, str]] = (),
                          suspended: Sequence[tuple[float, float]] = (), rated_clock_mhz: float | None = None,
                          thresholds: Thresholds = DEFAULT_THRESHOLDS,
                          lens: LensThresholds = DEFAULT_LENS_THRESHOLDS) -> DeviceLens:
    """:func:`lens_device` one sample at a time, as docs/method.md states it (covered time from the same
    interval helpers)."""
    out = DeviceLens()
    if samples is None or not len(samples):
        return out
    order, c = attribute_device_covered(window, samples, unknown=unknown, suspended=suspended,
                                        rated_clock_mhz=rated_clock_mhz, thresholds=thresholds,
                                        use=lambda cs: (cs.order, cs.covered.copy()))[1]

    def get(x: np.ndarray | None, i: int) -> float | None:
        if x is None:
            return None
        v = float(x[i])
        return None if v != v else v

    tensor, measured, unmeasured, delivered = [], [], [], []
    counted, counted_s, uncounted, rated_s = [], [], [], []
    pipes: dict[str, list[float]] = {p: [] for p in PIPES}
    pipes_uncounted: dict[str, list[float]] = {p: [] for p in PIPES}
    seen = {p: False for p in PIPES}
    bound: dict[str, list[float]] = {b: [] for b in (*BOUNDS, "unmeasured")}
    for k, i in enumerate(range(len(samples)) if isinstance(order, slice) else order.tolist()):
        cov = float(c[k])
        clock = get(samples.sm_clock, i)
        r = 1.0
        if rated_clock_mhz:
            r = 1.0 if clock is None else max(min(clock / float(rated_clock_mhz), 1.0), 0.0)
        ten = get(samples.tensor, i)
        if ten is None:
            unmeasured.append(cov)
        else:
            ten = min(max(ten, 0.0), 1.0)
            tensor.append(cov * ten * r)
            measured.append(cov)
        ops, dt = get(samples.ops, i), get(samples.dt, i)
        has_ops = ops is not None and dt is not None and dt > 0
        if has_ops:
            counted.append(max(ops, 0.0) * cov / dt)
            counted_s.append(cov)
        elif ten is not None:
            uncounted.append(cov * ten * r)
        if has_ops or ten is not None:
            rated_s.append(cov)
        high = ten is not None and ten >= lens.pipe_high
        for p in PIPES:
            v = get(getattr(samples, p), i)
            if v is not None:
                v = min(max(v, 0.0), 1.0)
                seen[p] = True
                pipes[p].append(cov * v * r)
                if not has_ops:
                    pipes_uncounted[p].append(cov * v * r)
                high = high or v >= lens.pipe_high
        act = get(samples.activity, i)
        if act is None or min(max(act, 0.0), 1.0) < thresholds.active_min:
            continue
        d = cov * min(max(act, 0.0), 1.0) * r
        delivered.append(d)
        dram, occ, sm = get(samples.dram, i), get(samples.occupancy, i), get(samples.sm, i)
        if high:
            bound["compute"].append(d)
        elif dram is not None and dram >= lens.dram_high:
            bound["memory"].append(d)
        elif sm is not None and sm >= lens.sm_high and occ is not None and occ < lens.occupancy_low:
            bound["latency"].append(d)
        elif ten is None and dram is None and occ is None:
            bound["unmeasured"].append(d)
        else:
            bound["other"].append(d)
    out.tensor_s, out.measured_s, out.unmeasured_s = math.fsum(tensor), math.fsum(measured), math.fsum(unmeasured)
    out.delivered_s = math.fsum(delivered)
    out.counted_flop, out.counted_s = math.fsum(counted), math.fsum(counted_s)
    out.tensor_uncounted_s, out.rated_s = math.fsum(uncounted), math.fsum(rated_s)
    out.pipes_s = {p: (math.fsum(pipes[p]) if seen[p] else None) for p in PIPES}
    out.pipes_uncounted_s = {p: (math.fsum(pipes_uncounted[p]) if seen[p] else None) for p in PIPES}
    out.bound_s = {b: math.fsum(v) for b, v in bound.items()}
    return out


def peak_tflops(rating, precision: str) -> float | None:  # noqa: ANN001 - a skus.SkuRating
    """The SKU's dense peak at the precision (None: not rated, or the table has no figure for it)."""
    if rating is None:
        return None
    return getattr(rating, {"bf16": "peak_bf16_dense_tflops", "fp16": "peak_fp16_dense_tflops",
                            "fp8": "peak_fp8_dense_tflops", "tf32": "peak_tf32_dense_tflops",
                            "fp64": "peak_fp64_tensor_tflops"}[precision], None)


def pipe_peaks(rating) -> dict[str, float | None]:  # noqa: ANN001 - a skus.SkuRating
    """The SKU's non-tensor peak (TFLOPS) for each pipe 1.2.0 prices (None: not rated, or no public figure)."""
    return {p: (None if rating is None else getattr(rating, f, None)) for p, f in PIPE_PEAKS.items()}


def lens_block(per_device: Sequence[tuple], precision: str, unmeasured_extra_nanohours: int = 0,
               version: str = LENS_METHOD_VERSION) -> dict:
    """The receipt's ``effective_compute`` block from (lens, peak TFLOPS at the precision, MIG share[, non-tensor
    pipe peaks as :func:`pipe_peaks` gives them]) per device.

    ``unmeasured_extra_nanohours``: covered time of devices measured by a summary only (no samples, so no field).
    ``version`` 1.2.0 adds to the achieved FLOPs each FP32/FP64 pipe's Σ c × pipe × r at the SKU's non-tensor
    peak (samples without an op count), and says where the achieved FLOPs came from (``flops_source``)."""
    pipes_priced = version == PIPES_METHOD_VERSION
    per_device = [(*d[:3], d[3] if len(d) > 3 else {}) for d in per_device]
    tensor_nanohours = sum(x.nanohours(x.tensor_s) for x, _p, _m, _pp in per_device)
    unmeasured_nanohours = sum(x.nanohours(x.unmeasured_s) for x, _p, _m, _pp in per_device) + unmeasured_extra_nanohours
    pipes = {}
    for p in PIPES:
        vals = [x.nanohours(x.pipes_s[p]) for x, _p, _m, _pp in per_device if x.pipes_s[p] is not None]
        pipes[p] = sum(vals) / 1e9 if vals else None
    achieved = rated = 0.0
    peak_known = counted_any = unrated = False
    sources = set()
    flops_from = set()   # 1.2.0: what the achieved FLOPs were read from
    for x, peak, share, ppeaks in per_device:
        if x.counted_s > 0:
            sources.add("op_counters")
            flops_from.add("op_counters")
        if x.tensor_uncounted_s > 0 or (x.measured_s > 0 and x.counted_s <= 0):
            sources.add("tensor_active")
        # counted operations first (ops counted, not inferred: no peak needed); tensor activity × peak where
        # no counter was read
        achieved += x.counted_flop / 1e15 / 3600.0
        counted_any = counted_any or x.counted_s > 0
        if peak is None and x.rated_s > 0:
            unrated = True  # measured time with no rating: the share would mix rated and unrated parts
        if peak is None or x.rated_s <= 0:
            continue
        peak_known = True
        pf = peak / 1000.0 * (1.0 if share is None else share)
        achieved += x.tensor_uncounted_s / 3600.0 * pf
        rated += x.rated_s / 3600.0 * pf
        if x.rated_s > x.counted_s or x.tensor_uncounted_s > 0:
            flops_from.add("activity")
        if pipes_priced:  # the FP pipes at their own (non-tensor) peak: FP32/FP64 math the tensor cores did not do
            for p, pipe_peak in ppeaks.items():
                v = x.pipes_uncounted_s.get(p)
                if v and pipe_peak:
                    achieved += v / 3600.0 * pipe_peak / 1000.0 * (1.0 if share is None else share)
    delivered = math.fsum(x.delivered_s for x, *_rest in per_device)
    bound = {}
    for b in (*BOUNDS, "unmeasured"):
        part = math.fsum(x.bound_s[b] for x, *_rest in per_device)
        bound[b] = round(part / delivered, 6) if delivered > 0 else None
    out = {
        "method": {"name": "ipledger-attribution", "version": version},
        "precision": precision,
        "source": "mixed" if len(sources) > 1 else (sources.pop() if sources else None),
        "tensor_gpu_hours": tensor_nanohours / 1e9,
        "fp64_gpu_hours": pipes["fp64"], "fp32_gpu_hours": pipes["fp32"], "fp16_gpu_hours": pipes["fp16"],
        "achieved_pflop_hours": round(achieved, 9) if peak_known or counted_any else None,
        "rated_pflop_hours": round(rated, 9) if peak_known else None,
        "rated_share": round(achieved / rated, 6) if peak_known and rated > 0 and not unrated else None,
        "bound_split": bound,
        "unmeasured_gpu_hours": unmeasured_nanohours / 1e9,
    }
    if pipes_priced:
        out["flops_source"] = ("unmeasured" if out["achieved_pflop_hours"] is None or not flops_from else
                               "mixed" if len(flops_from) > 1 else flops_from.pop())
    return out


def precision_for(site_or_contract: Mapping | None, sku_key: str | None, account: str | None) -> str:
    """``compute_precision``: a per-account or per-SKU table, or one string; bf16 by default."""
    v = (site_or_contract or {}).get("compute_precision", "bf16")
    if isinstance(v, Mapping):
        v = v.get(account or "", v.get(sku_key or "", v.get("default", "bf16")))
    v = str(v).lower()
    if v not in PRECISIONS:
        raise ValueError(f"compute_precision: {v!r} is not one of {', '.join(PRECISIONS)}")
    return v
