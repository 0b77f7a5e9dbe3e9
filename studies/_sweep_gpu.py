"""Block-count sweep of the fused kernels (device machine only; used to pick fpsim.torch_backend._BB)."""
import torch

from fpsim import torch_backend as tb
from studies.bench_gpu import cuda_time

x = torch.randn(65536, 4096, device="cuda")
gb = x.numel() * 4 / 1e9
amax = tb.absmax(x)
for bb in (32, 64, 128, 256):
    tb._BB = bb
    d, s, _ = tb.quantize_nvfp4_fused(x, tensor_amax=amax)
    tq = cuda_time(lambda: tb.quantize_nvfp4_fused(x, tensor_amax=amax))
    td = cuda_time(lambda: tb.dequantize_nvfp4_fused(d, s, amax, 4096))
    tm = cuda_time(lambda: tb.quantize_mx_fused(x, "float4_e2m1fn"))
    print(f"BB={bb}: nvfp4 quant {gb / tq:.0f} GB/s, dequant {gb / td:.0f} GB/s, mxfp4 quant {gb / tm:.0f} GB/s")
