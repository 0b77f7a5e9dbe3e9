"""Every number the benchmark and profile scripts print measures what its label says (the 2026-12-04 audit of
their labels): fast CPU checks of the counting code, with fake profiler events where a profile is needed."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.autograd import DeviceType  # noqa: E402

from studies.bench import codecs as bench_codecs  # noqa: E402
from studies.bench import gemm as bench_gemm  # noqa: E402
from studies.bench import host as bench_host  # noqa: E402
from studies.bench import profiling  # noqa: E402
from studies.bench import scaling as bench_scaling  # noqa: E402


class _Range:
    def __init__(self, us):
        self.us = us

    def elapsed_us(self):
        return self.us


def _event(name, device, us, annotation=False):
    """A stand-in for torch.autograd.profiler_util.FunctionEvent: what ``profiling`` reads of one."""
    return SimpleNamespace(name=name, device_type=device, time_range=_Range(us), self_cpu_time_total=us,
                           cpu_time_total=us, cpu_parent=None, is_user_annotation=annotation)


class _Prof:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


ADAMW = "Optimizer.step#AdamW.step"


def _device_profile():
    """Two steps: the AdamW kernel (1 ms a step) inside torch's optimizer annotation (a span over it, 1.1 ms), a
    GEMM (3 ms a step), and the host-side events of the same names."""
    return _Prof([
        _event("multi_tensor_apply_kernel", DeviceType.CUDA, 2000), _event("nvjet_gemm", DeviceType.CUDA, 6000),
        _event(ADAMW, DeviceType.CUDA, 2200, annotation=True),
        _event(ADAMW, DeviceType.CPU, 500, annotation=True), _event("aten::mm", DeviceType.CPU, 100),
    ])


def test_device_time_leaves_out_user_annotations_that_span_counted_kernels():
    ms = profiling.kernel_ms(_device_profile(), steps=2)
    assert ms == pytest.approx({"multi_tensor_apply_kernel": 1.0, "nvjet_gemm": 3.0})
    assert sum(ms.values()) == pytest.approx(4.0)  # the step's GPU time, the AdamW kernel counted once


def test_cpu_operator_time_leaves_out_user_annotations():
    prof = _Prof([_event("aten::mm", DeviceType.CPU, 300), _event(ADAMW, DeviceType.CPU, 900, annotation=True)])
    assert profiling.kernel_ms(prof, steps=3) == pytest.approx({"aten::mm": 0.1})


def test_the_report_totals_are_the_kernels_alone():
    arm = profiling.arm_entry(_device_profile(), 0.01, 2)
    text = profiling.report("t", "c", {"bf16": arm, "nvfp4": arm}, "cpu", None)  # "cpu": no GPU name asked for
    assert "| **all** | **4.00** | **4.00** | **+0.00** |" in text and ADAMW not in text


def test_dgrad_and_wgrad_copies_of_dy_count_one_read_and_two_writes():
    bench_gpu = pytest.importorskip("studies.bench.gpu")
    n = 16 * 4096
    rows = bench_gpu.operations(SimpleNamespace(x=torch.empty(16, 4096)))  # the calls are not made
    per_el = {label: gb * 1e9 / n for label, _, gb, _ in rows}
    pair = [v for k, v in per_el.items() if "dY" in k or "rht_transposed_scaled_pair" in k]
    assert pair == pytest.approx([6.0, 6.0])  # BF16 dY read (2 B), two BF16 copies written (4 B)
    assert per_el["  the same, amax pass + RHT and quantize in registers (`rht_transposed_scaled`, Xᵀ never "
                  "written)"] == pytest.approx(4.0)
    assert per_el["NVFP4 dequantize → BF16"] == pytest.approx(2 + 0.5 + 1 / 16)


def test_gpu_table_says_its_gbs_column_is_float32_equivalent():
    bench_gpu = pytest.importorskip("studies.bench.gpu")
    assert "float32-equivalent GB/s (4 B × elements)" in bench_gpu.TABLE_HEADER
    assert "GB/s of float32 input" not in bench_gpu.TABLE_HEADER


def test_codec_header_says_decode_counts_float32_output_and_the_ratio_is_one_thread():
    assert "*output* of decode" in bench_codecs.UNITS and "one-thread decode" in bench_codecs.UNITS
    assert "decode 1 thr ÷ memcpy" in bench_codecs.COLUMNS and "(float32 out)" in bench_codecs.COLUMNS


def test_gemm_header_states_the_rht_rounds_and_the_median_ratio():
    note = bench_gemm.timing_note(3)
    assert "best of 3" in note and "7 rounds" in note and "median" in note and "3 s" in note
    assert bench_gemm.rht_rounds(3) == 7 and bench_gemm.rht_rounds(9) == 9


def test_gemm_agreement_is_the_largest_difference_over_the_products_magnitude():
    import fpsim

    rng = np.random.default_rng(0)
    qa = fpsim.quantize(rng.standard_normal((8, 64)).astype(np.float32), "nvfp4")
    qb = fpsim.quantize(rng.standard_normal((4, 64)).astype(np.float32), "nvfp4")
    ref = fpsim.gemm(qa, qb, "fp32")
    c = ref.copy()
    mag = np.abs(qa.dequantize()).astype(np.float64) @ np.abs(qb.dequantize()).astype(np.float64).T
    c[2, 1] += np.float32(1e-3 * mag[2, 1])
    assert bench_gemm.agreement(c, ref, qa, qb) == pytest.approx(1e-3, rel=1e-3)
    assert bench_gemm.agreement(ref, ref, qa, qb) == 0.0


def test_host_header_gives_each_rows_call_count():
    rows = [("baseline: F.linear", 1e-5, bench_host.CALLS), ("copy fprop_x", 2e-5, bench_host.CALLS),
            ("nn.Linear forward + backward (float32)", 1e-4, bench_host.LAYER_CALLS)]
    note = bench_host.timing_note(rows)
    assert "7 rounds of 2,000 calls" in note and "nn.Linear forward + backward: 7 × 1,000" in note
    assert bench_host.timing_note(rows[:2]) == "median of 7 × 2,000 calls"


def test_scaling_header_gives_the_baselines_rounds_and_the_runs_own_drift():
    assert bench_scaling.rounds_note(7) == ("best of 7 rounds (the plain-NumPy, ml_dtypes and MXFP8 baselines: "
                                            "best of 2 rounds)")
    note = bench_scaling.drift_note([9.0, 10.0, 11.0, 10.0])
    assert "9.0–11.0 GB/s" in note and "4 rounds" in note and "±10%" in note and "25" not in note
