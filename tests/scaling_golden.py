"""Named golden cases of block scaling, as data (SPEC §4–§6, §9), each derived by hand below.

Shared by every backend's tests: ``(name, scheme, kwargs, x, codes, scales, decoded)``;
``codes`` are unpacked element codes per row of the quantized 2-D view including the
zero padding; ``scales`` raw scale bytes (float32 values for FP32 scales);
``decoded`` the expected float32 output (None: not checked; NaN compared as NaN,
zero signs compared).

Recurring facts (float32): fl(1/6) = 11184811·2^-26, so 6·fl(1/6) = 1 + 2^-25,
which rounds to 1.0; 2688 = 6·448 makes S_enc = 1, S_dec = 1 whenever the tensor
amax is 2688.  E4M3 bytes: 448 = 0x7E, 1.0 = 0x38, 8 = 0x50, 10 = 0x52,
0.171875 = 0x23, 2^-8 = 0x02 (subnormal 2·2^-9), 2^-9 = 0x01.
"""

from __future__ import annotations

import numpy as np

NAN = float("nan")
INF = float("inf")


def blk(*vals, n=16):
    """One block: the values then zero padding to n."""
    return list(vals) + [0.0] * (n - len(vals))


A = blk(2688.0)  # a first block whose amax 2688 gives S_enc = S_dec = 1
A_CODES = blk(0x7)

NVFP4 = [
    # amax = 0: S_enc = 1; vmax = 0 → s_b = 0; enc_b = min(1/0, FLT_MAX); 0·FLT_MAX = 0.
    ("zero tensor", "nvfp4", {}, [blk()], [blk()], [[0x00]], [blk()]),
    # −0 keeps its sign: code 0x8, decoded (−0·0)·1 = −0.
    ("negative zero", "nvfp4", {}, [[-0.0] * 16], [[0x8] * 16], [[0x00]], [[-0.0] * 16]),
    # block 2: vmax 2688 → sdb = 2688·fl(1/6) → 448 → 0x7E; enc = fl(1/448) and 448·fl(1/448) = 1 + 192·2^-32 → 1.0.
    (
        "zero block inside a tensor",
        "nvfp4",
        {},
        [blk() + blk(2688.0, 448.0, -448.0)],
        [blk() + blk(0x7, 0x2, 0xA)],
        [[0x00, 0x7E]],
        [blk() + blk(2688.0, 448.0, -448.0)],
    ),
    # vmax = 6·2^-8: sdb = 2^-8·(1 + 2^-25) → 2^-8 → E4M3 subnormal 0x02; enc = 256.
    (
        "subnormal E4M3 scale",
        "nvfp4",
        {},
        [A + blk(6 * 2.0**-8, 2.0**-8, -3 * 2.0**-8)],
        [A_CODES + blk(0x7, 0x2, 0xD)],
        [[0x7E, 0x02]],
        [[2688.0] + [0.0] * 15 + blk(6 * 2.0**-8, 2.0**-8, -3 * 2.0**-8)],
    ),
    # vmax = 6·2^-10: sdb = 2^-10, the midpoint between 0 and 2^-9 → even → 0x00 (a zero scale).
    # vmax = 7·2^-10: sdb ≈ 1.17·2^-10 → 2^-9 (0x01); enc = 512; 3.5 → tie → 4 (0x6); decoded 4·2^-9.
    (
        "E4M3 scale tie at half the smallest subnormal",
        "nvfp4",
        {},
        [A + blk(6 * 2.0**-10) + blk(7 * 2.0**-10)],
        [A_CODES + blk(0x7) + blk(0x6)],
        [[0x7E, 0x00, 0x01]],
        [[2688.0] + [0.0] * 15 + blk(0.0) + blk(2.0**-7)],
    ),
    # 1e-7 × the tensor amax: sdb ≈ 4.5e-5 < 2^-10 → scale 0; enc = FLT_MAX; x·FLT_MAX = ±inf → ±6; decoded ±0.
    (
        "zero E4M3 scale (block 1e-7 x amax)",
        "nvfp4",
        {},
        [A + blk(2.688e-4, -1e-4)],
        [A_CODES + blk(0x7, 0xF)],
        [[0x7E, 0x00]],
        [[2688.0] + [0.0] * 15 + blk(0.0, -0.0)],
    ),
    # vmax 6 → s_b = 1.0 (0x38), enc = 1: every E2M1 midpoint goes to the even code.
    (
        "E2M1 ties after scaling",
        "nvfp4",
        {},
        [A + blk(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0)],
        [A_CODES + blk(0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0xC, 0xE)],
        [[0x7E, 0x38]],
        [[2688.0] + [0.0] * 15 + blk(6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -2.0, -4.0)],
    ),
    # 51·fl(1/6) = 8.5 + 17·2^-26 → 8.5 (half ulp is 32·2^-26): tie 8|9 → 8 (0x50); 51/8 = 6.375 saturates to 6.
    # 57·fl(1/6) → 9.5: tie 9|10 → 10 (0x52); 57·fl(0.1) ≈ 5.7 → 6.
    (
        "E4M3 scale ties and element saturation",
        "nvfp4",
        {},
        [A + blk(51.0) + blk(57.0)],
        [A_CODES + blk(0x7) + blk(0x7)],
        [[0x7E, 0x50, 0x52]],
        [[2688.0] + [0.0] * 15 + blk(48.0) + blk(60.0)],
    ),
    # Operation order matters at E4M3 ties (SPEC §4): amax 100 → S_enc = fl(2688/100) = 26.8799991607666;
    # vmax = 0.3487723469734192: vmax · fl(S_enc · fl(1/6)) = 1.5625001192 (one ulp above the tie 1.5|1.625)
    # → 1.625 (0x3D), whereas (vmax · S_enc) · fl(1/6) lands exactly on the tie 1.5625 → even → 1.5 (0x3C).
    # Elements: 100 → 6 (0x7); the block value ≈ 5.77 after scaling → 6 (0x7).
    (
        "E4M3 scale tie decided by the operation order",
        "nvfp4",
        {},
        [blk(100.0) + blk(0.3487723469734192)],
        [blk(0x7) + blk(0x7)],
        [[0x7E, 0x3D]],
        None,
    ),
    # amax = inf: 2688/inf = 0 → S_enc = 1.  Block with inf: sdb = min(inf, 448) = 448; ±inf → ±6.
    # Block [1]: sdb = fl(1/6) → E4M3 0.171875 (0x23); enc = 5.818…; 1·enc → 6 (0x7); decoded 1.03125.
    (
        "inf",
        "nvfp4",
        {},
        [blk(INF, 448.0, -INF) + blk(1.0)],
        [blk(0x7, 0x2, 0xF) + blk(0x7)],
        [[0x7E, 0x23]],
        [blk(2688.0, 448.0, -2688.0) + blk(1.03125)],
    ),
    # NaN propagates: amax NaN → S_enc NaN → every scale 0x7F and every code the E2M1 NaN code 0x7; all decode NaN.
    ("NaN propagates", "nvfp4", {}, [blk(NAN, 1.0) + blk(2.0)], [[0x7] * 32], [[0x7F, 0x7F]], [[NAN] * 32]),
    # nan_amax="ignore": amax 2688 without the NaN; the NaN element itself encodes to +6 (finite, documented).
    (
        "NaN ignored",
        "nvfp4",
        {"nan_amax": "ignore"},
        [blk(NAN, 2688.0) + blk(6.0)],
        [blk(0x7, 0x7) + blk(0x7)],
        [[0x7E, 0x38]],
        [blk(2688.0, 2688.0) + blk(6.0)],
    ),
    # amax = 2^-149: 2688/amax overflows → S_enc = FLT_MAX; sdb ≈ 8e-8 → 0; enc = FLT_MAX; x·FLT_MAX ≈ 2^-21 → 0.
    ("tiny tensor: S_enc capped at FLT_MAX", "nvfp4", {}, [blk(2.0**-149)], [blk()], [[0x00]], [blk()]),
    # (3, 20): padded to 32 columns; row 0 block 0: 6·fl(1/448) ≈ 0.013 → 0; the tail block [6]*4 has scale 1.0.
    (
        "ragged 3x20",
        "nvfp4",
        {},
        [[2688.0] + [6.0] * 19, [6.0] * 20, [6.0] * 20],
        [[0x7] + [0x0] * 15 + blk(7, 7, 7, 7), [0x7] * 16 + blk(7, 7, 7, 7), [0x7] * 16 + blk(7, 7, 7, 7)],
        [[0x7E, 0x38], [0x38, 0x38], [0x38, 0x38]],
        [[2688.0] + [0.0] * 15 + [6.0] * 4, [6.0] * 20, [6.0] * 20],
    ),
]


def _tile_case():
    x = np.zeros((16, 32), np.float32)
    x[15, 0], x[3, 20], x[0, 17] = 2688.0, 6.0, -3.0
    codes = np.zeros((16, 32), np.int64)
    codes[15, 0], codes[3, 20], codes[0, 17] = 0x7, 0x7, 0xD
    scales = np.tile([0x7E, 0x38], (16, 1))
    return ("2D 16x16 tiles", "nvfp4", {"block": (16, 16)}, x.tolist(), codes.tolist(), scales.tolist(), x.tolist())


NVFP4.append(_tile_case())

# Column-wise (axis=0) copy: x is (16, 2); the quantized view is x.T.
AXIS0 = (
    "axis=0",
    "nvfp4",
    {"axis": 0},
    np.array([blk(2688.0), blk(6.0, 0.25)], np.float32).T.tolist(),
    [A_CODES, blk(0x7, 0x0)],
    [[0x7E], [0x38]],
    None,
)
NVFP4.append(AXIS0)


def _mx(rows, n=32):
    return [blk(*r, n=n) for r in rows]


# MX: scale byte per rule (floor, ceil, even, rceil) for one block of 32; codes for the rceil byte.
# E2M1 emax = 2, max 6; fl(1/6)·6 → 1.0.
MX_RULES = [
    # name, element, values, {rule: byte}
    ("amax 6", "e2m1", [6.0, 1.0, -0.5], {"floor": 127, "ceil": 128, "even": 127, "rceil": 127}),
    # 7 = 1.75·2^2: floor keeps E = 0 (7 saturates to 6); rceil: 7·fl(1/6) → 2^1; even: 1.75 → 2.0 carries.
    ("amax 7 = 7*2^0", "e2m1", [7.0], {"floor": 127, "ceil": 128, "even": 128, "rceil": 128}),
    # one float32 ulp below 8: floor(log2) = 2 from the bits (a float32 log2 rounds to 3.0).
    (
        "amax one ulp below 8",
        "e2m1",
        [float(np.nextafter(np.float32(8), np.float32(0)))],
        {"floor": 127, "ceil": 128, "even": 128, "rceil": 128},
    ),
    ("amax 4 (a power of two)", "e2m1", [4.0, -1.0], {"floor": 127, "ceil": 127, "even": 127, "rceil": 127}),
    ("zero block", "e2m1", [-0.0], {"floor": 0, "ceil": 0, "even": 0, "rceil": 0}),
    ("NaN amax", "e2m1", [NAN, 1.0], {"floor": 0xFF, "ceil": 0xFF, "even": 0xFF, "rceil": 0xFF}),
    ("inf amax", "e2m1", [INF, -INF, 1.0], {"floor": 0xFE, "ceil": 0xFE, "even": 0xFE, "rceil": 0xFE}),
    # 2^-140: every rule's exponent is below -127 → clamped → byte 0 (2^-127).
    ("tiny amax clamps to 2^-127", "e2m1", [2.0**-140], {"floor": 0, "ceil": 0, "even": 0, "rceil": 0}),
    # 1.5·2^127: floor 127 − 2 = 125; rceil 1.5·fl(1/6) → 0.25 exactly → 2^125.
    ("huge amax", "e2m1", [1.5 * 2.0**127], {"floor": 252, "ceil": 253, "even": 252, "rceil": 252}),
    # E4M3: 448·fl(1/448) = 1 + 192·2^-32 → 1.0 → rceil E = 0; 448 = 1.75·2^8 is not a power of two (ceil +1).
    ("e4m3 amax 448", "e4m3", [448.0], {"floor": 127, "ceil": 128, "even": 127, "rceil": 127}),
    # 480 = 1.875·2^8: floor and even keep E = 0 and 480 saturates to 448; rceil → 2^1.
    ("e4m3 amax 480", "e4m3", [480.0], {"floor": 127, "ceil": 128, "even": 127, "rceil": 128}),
]

# (name, element, values, rule, expected codes of the values, expected decoded values)
MX_CODES = [
    ("amax 6 rceil", "e2m1", [6.0, 1.0, -0.5], "rceil", [0x7, 0x2, 0x9], [6.0, 1.0, -0.5]),
    # E = 1: 3 → 0x5, 0.5 → 0x1, -0.25 → tie 0|0.5 → even 0 → 0x8.
    ("amax 6 ceil", "e2m1", [6.0, 1.0, -0.5], "ceil", [0x5, 0x1, 0x8], [6.0, 1.0, -0.0]),
    ("amax 7 floor saturates", "e2m1", [7.0], "floor", [0x7], [6.0]),
    # E = 1: 3.5 → tie 3|4 → 4 (0x6); decoded 8.
    ("amax 7 rceil", "e2m1", [7.0], "rceil", [0x6], [8.0]),
    ("zero block keeps -0", "e2m1", [-0.0], "rceil", [0x8], [-0.0]),
    ("NaN block", "e2m1", [NAN, 1.0], "rceil", [0x7] * 32, [NAN] * 32),
    # E = 127: ±inf saturate to ±6 (decoded 6·2^127 = ±inf again); 1·2^-127 → 0.
    ("inf block", "e2m1", [INF, -INF, 1.0], "rceil", [0x7, 0xF, 0x0], [INF, -INF, 0.0]),
    ("e4m3 480 floor saturates", "e4m3", [480.0], "floor", [0x7E], [448.0]),
    # 240 = 1.875·2^7: E4M3 exponent field 14, mantissa 7 → 0x77.
    ("e4m3 480 rceil", "e4m3", [480.0], "rceil", [0x77], [480.0]),
]

# (name, scheme, x rows, codes rows, scales, decoded rows)
FP8 = [
    # d = 896/448 = 2: y = 448, 0.5, -1.5, 0 → 0x7E, 0x30, 0xBC, 0x00.
    (
        "e4m3 per tensor",
        "fp8_e4m3",
        [[896.0, 1.0, -3.0, 0.0]],
        [[0x7E, 0x30, 0xBC, 0x00]],
        2.0,
        [[896.0, 1.0, -3.0, 0.0]],
    ),
    # d = 2: 57344 = 1.75·2^15 → 0x7B; 0.5 → 0x38; −0 → 0x80.
    (
        "e5m2 per tensor",
        "fp8_e5m2",
        [[114688.0, 1.0, 0.0, -0.0]],
        [[0x7B, 0x38, 0x00, 0x80]],
        2.0,
        [[114688.0, 1.0, 0.0, -0.0]],
    ),
    ("zero tensor", "fp8_e4m3", [[0.0, 0.0]], [[0, 0]], 1.0, [[0.0, 0.0]]),
    # blockwise 1×128: d = 1792/448 = 4 → 0x7E, 0.75 → 0x34; a zero row gets d = 1.
    (
        "block128",
        "fp8_block128",
        [blk(1792.0, 3.0, n=128), blk(n=128)],
        [blk(0x7E, 0x34, n=128), blk(n=128)],
        [[4.0], [1.0]],
        [blk(1792.0, 3.0, n=128), blk(n=128)],
    ),
]

# Swizzle offsets by hand from SPEC §4 for [130, 5] (padded to [256, 8], ⌈C/4⌉ = 2): (r, c, offset).
SWIZZLE = [(0, 0, 0), (0, 3, 3), (0, 4, 512), (1, 0, 16), (33, 1, 21), (32, 0, 4), (96, 2, 14), (129, 6, 1554)]
