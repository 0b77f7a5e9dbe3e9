"""Where a training step's time goes, from a ``torch.profiler`` trace: device time per kernel grouped by kind,
the host's CUDA calls that copy or wait, and the implicit host-device synchronisations torch reports
(``studies.bench.training --profile`` and ``studies.campaign.run --profile`` write these tables)."""

from __future__ import annotations

import datetime
from pathlib import Path

import torch

__all__ = ["profiler", "arm_entry", "kernel_ms", "host_calls", "SyncWatch", "kind", "report"]

def profiler(device: str):
    """A ``torch.profiler`` profile of the host, and of CUDA kernels on a GPU (a context, entered around the steps
    to profile).  ``acc_events``: one window is profiled, so nothing changes but a warning (torch 2.11 warns that
    events of earlier cycles are cleared, which pytest's warnings-as-errors turned into a failure on the H200)."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []),
                   acc_events=True)


def arm_entry(prof, seconds_per_step: float, steps: int) -> tuple:
    """One arm of :func:`report` from its finished profile of ``steps`` steps."""
    return seconds_per_step, kernel_ms(prof, steps), host_calls(prof, steps)


_GEMM_NAMES = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "_mm_")


def _annotation(e) -> bool:
    """Whether a profiler event is a user annotation (``record_function``, e.g. torch's own
    ``Optimizer.step#AdamW.step``) rather than a kernel or an operator.  On the device such an event is a span
    over kernels that the profile also lists one by one, so summing it counts their time twice (torch's own
    tables skip it the same way: ``FunctionEvent.is_user_annotation``)."""
    return bool(getattr(e, "is_user_annotation", False))


def kernel_ms(prof, steps: int) -> dict[str, float]:
    """Device milliseconds per step of each kernel name in a profile (CUDA kernels; on the CPU, operators' self
    time instead, to keep the code path exercised).  User annotations are left out (:func:`_annotation`): on the
    device they span kernels counted on their own (before 2026-12-04 the AdamW step's span added 1.9 ms per step
    to the benchmark GPT's "other" and "all" rows)."""
    from torch.autograd import DeviceType

    cuda = any(e.device_type == DeviceType.CUDA and not _annotation(e) for e in prof.events())
    out: dict[str, float] = {}
    for e in prof.events():
        if _annotation(e):
            continue
        if cuda and e.device_type == DeviceType.CUDA:
            us = e.time_range.elapsed_us()
        elif not cuda and e.device_type == DeviceType.CPU:
            us = e.self_cpu_time_total
        else:
            continue
        out[e.name] = out.get(e.name, 0.0) + us / 1e3 / steps
    return out


_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cudaMemcpyAsync", "cuStreamSynchronize", "cuMemcpyHtoD", "cuMemcpyDtoH")


def host_calls(prof, steps: int) -> tuple[dict[str, tuple[float, float]], float]:
    """(CUDA runtime calls that copy or wait → (calls per step, host ms per step), host ms per step of the
    profiled region's top-level operators); a mid-step wait shows as a synchronize or a device-to-host copy."""
    from torch.autograd import DeviceType

    calls: dict[str, list[float]] = {}
    top = 0.0
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            continue
        if e.name in _SYNC_CALLS:
            c = calls.setdefault(e.name, [0.0, 0.0])
            c[0] += 1 / steps
            c[1] += e.cpu_time_total / 1e3 / steps
        if e.cpu_parent is None and not e.name.startswith(("cuda", "cu")):
            top += e.cpu_time_total / 1e3 / steps
    return {k: (v[0], v[1]) for k, v in calls.items()}, top


class SyncWatch:
    """A context entered around the steps to watch (as a profiler would be): records every implicit host-device
    synchronisation torch reports in ``torch.cuda.set_sync_debug_mode("warn")``, with the Python line that caused
    it (CUDA only)."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._log = self._catch.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)
        self._catch.__exit__(*exc)
        for w in self._log:
            if "synchroniz" in str(w.message):
                where = f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:80]}"
                self.seen[where] = self.seen.get(where, 0) + 1
        return False


def kind(name: str) -> str:
    """The group a CUDA kernel's time is reported under, from its name."""
    low = name.lower()
    if any(k in low for k in _GEMM_NAMES):
        return "GEMM (cuBLAS/CUTLASS)"
    if "flash" in low or "attention" in low or "fmha" in low:
        return "attention"
    if low.endswith("_kernel"):  # Triton kernels are named after their Python functions (fpsim's end in _kernel)
        return "Triton (fpsim)"
    return "other (torch elementwise, reductions, copies, optimizer)"


def report(title: str, context: str, arms: dict, device: str, watch: SyncWatch | None) -> str:
    """The Markdown tables of two profiled arms ``{"bf16": (s/step, kernel_ms, host_calls), "<arm>": …}`` (the
    first is the baseline), and the synchronisations ``watch`` recorded (None: not measured)."""
    (lb, (tb, kb, hb)), (ln, (tn, kn, hn)) = list(arms.items())[:2]
    kfun = kind if device == "cuda" else (lambda name: "CPU operator")
    kinds: dict[str, list[float]] = {}
    for name in set(kb) | set(kn):
        row = kinds.setdefault(kfun(name), [0.0, 0.0])
        row[0] += kb.get(name, 0.0)
        row[1] += kn.get(name, 0.0)
    unit = "device ms / step" if device == "cuda" else "CPU self ms / step (no GPU: operators, not kernels)"
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    lines = [f"# {title}", "", f"{datetime.date.today().isoformat()}, {gpu}, torch {torch.__version__}; {context}; "
             f"{unit}. Wall time per profiled step: {lb} {tb * 1e3:.1f} ms, {ln} {tn * 1e3:.1f} ms (the profiler "
             "adds host time).", "", f"| kind | {lb} | {ln} | difference |", "|---|---:|---:|---:|"]
    for k, (b, n) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {k} | {b:.2f} | {n:.2f} | {n - b:+.2f} |")
    lines.append(f"| **all** | **{sum(kb.values()):.2f}** | **{sum(kn.values()):.2f}** | "
                 f"**{sum(kn.values()) - sum(kb.values()):+.2f}** |")
    lines += ["", f"Kernels by their {ln} time (the 40 largest):", "", f"| kernel | kind | {lb} | {ln} | difference |",
              "|---|---|---:|---:|---:|"]
    for name in sorted(kn, key=lambda k: -kn[k])[:40]:
        lines.append(f"| `{name[:90]}` | {kfun(name)} | {kb.get(name, 0.0):.3f} | {kn[name]:.3f} | "
                     f"{kn[name] - kb.get(name, 0.0):+.3f} |")
    lines += ["", "Host side per step: top-level operators' host time, and the CUDA runtime calls that copy or "
              "wait (a wait inside the step keeps the host from running ahead of the GPU; one synchronize per step "
              "may be the caller's own, at the end of each timed step):", "",
              "| arm | host ms in operators | calls that copy or wait (per step: count, host ms) |", "|---|---:|---|"]
    for label, (_, _, (calls, top)) in ((lb, arms[lb]), (ln, arms[ln])):
        listed = ", ".join(f"{k} {n:.1f}× {ms:.2f} ms" for k, (n, ms) in sorted(calls.items())) or "none"
        lines.append(f"| {label} | {top:.2f} | {listed} |")
    if watch is None:
        lines += ["", "Implicit synchronisations: not measured (no GPU: `torch.cuda.set_sync_debug_mode` needs CUDA)."]
    else:
        lines += ["", f"Implicit synchronisations in one eager {ln} step (`torch.cuda.set_sync_debug_mode(\"warn\")`; "
                  "the calling line and how often):", ""]
        lines += [f"- `{k}` × {n}" for k, n in sorted(watch.seen.items(), key=lambda kv: -kv[1])] or ["- none"]
    return "\n".join(lines) + "\n"
