// Thin C wrappers around NVIDIA's host-callable conversions (cuda_fp4.h, cuda_fp6.h,
// cuda_fp8.h, cuda_bf16.h, cuda_fp16.h) so that Python tests can call them through ctypes.
// Built by tests/nvref/__init__.py with g++ or nvcc when the CUDA headers are present.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp6.h>
#include <cuda_fp4.h>

static cudaRoundMode round_mode(int r) {
    // 0 = rn, 1 = rz, 2 = ru (toward +inf), 3 = rd (toward -inf)
    switch (r) {
        case 1: return cudaRoundZero;
        case 2: return cudaRoundPosInf;
        case 3: return cudaRoundMinInf;
        default: return cudaRoundNearest;
    }
}

extern "C" {

void nv_f32_to_fp4(const float* x, uint8_t* out, size_t n, int rounding) {
    for (size_t i = 0; i < n; ++i)
        out[i] = __nv_cvt_float_to_fp4(x[i], __NV_E2M1, round_mode(rounding));
}

void nv_f32_to_fp6(const float* x, uint8_t* out, size_t n, int e3m2, int rounding) {
    for (size_t i = 0; i < n; ++i)
        out[i] = __nv_cvt_float_to_fp6(x[i], e3m2 ? __NV_E3M2 : __NV_E2M3, round_mode(rounding));
}

void nv_f32_to_fp8(const float* x, uint8_t* out, size_t n, int e5m2, int saturate) {
    for (size_t i = 0; i < n; ++i)
        out[i] = __nv_cvt_float_to_fp8(x[i], saturate ? __NV_SATFINITE : __NV_NOSAT,
                                       e5m2 ? __NV_E5M2 : __NV_E4M3);
}

void nv_f32_to_e8m0(const float* x, uint8_t* out, size_t n, int saturate, int rounding) {
    for (size_t i = 0; i < n; ++i)
        out[i] = __nv_cvt_float_to_e8m0(x[i], saturate ? __NV_SATFINITE : __NV_NOSAT,
                                        round_mode(rounding));
}

void nv_f32_to_bf16(const float* x, uint16_t* out, size_t n, int rounding) {
    for (size_t i = 0; i < n; ++i) {
        __nv_bfloat16 h;
        switch (rounding) {
            case 1: h = __float2bfloat16_rz(x[i]); break;
            case 2: h = __float2bfloat16_ru(x[i]); break;
            case 3: h = __float2bfloat16_rd(x[i]); break;
            default: h = __float2bfloat16_rn(x[i]);
        }
        std::memcpy(&out[i], &h, 2);
    }
}

void nv_f32_to_f16(const float* x, uint16_t* out, size_t n, int rounding) {
    for (size_t i = 0; i < n; ++i) {
        __half h;
        switch (rounding) {
            case 1: h = __float2half_rz(x[i]); break;
            case 2: h = __float2half_ru(x[i]); break;
            case 3: h = __float2half_rd(x[i]); break;
            default: h = __float2half_rn(x[i]);
        }
        std::memcpy(&out[i], &h, 2);
    }
}

// Decoders: every code of a format to float32 through NVIDIA's own conversions.
void nv_fp4_to_f32(const uint8_t* c, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        __half_raw h = __nv_cvt_fp4_to_halfraw(c[i], __NV_E2M1);
        out[i] = __half2float(__half(h));
    }
}

void nv_fp6_to_f32(const uint8_t* c, float* out, size_t n, int e3m2) {
    for (size_t i = 0; i < n; ++i) {
        __half_raw h = __nv_cvt_fp6_to_halfraw(c[i], e3m2 ? __NV_E3M2 : __NV_E2M3);
        out[i] = __half2float(__half(h));
    }
}

void nv_fp8_to_f32(const uint8_t* c, float* out, size_t n, int e5m2) {
    for (size_t i = 0; i < n; ++i) {
        __half_raw h = __nv_cvt_fp8_to_halfraw(c[i], e5m2 ? __NV_E5M2 : __NV_E4M3);
        out[i] = __half2float(__half(h));
    }
}

void nv_e8m0_to_f32(const uint8_t* c, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        __nv_bfloat16_raw b = __nv_cvt_e8m0_to_bf16raw(c[i]);
        out[i] = __bfloat162float(__nv_bfloat16(b));
    }
}

}  // extern "C"
