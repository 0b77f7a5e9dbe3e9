"""Hand-written vector code for the hottest blocks of 16 elements (NVFP4, MX, the RHT) and for the lanes of the
analysis' sums.  Private.

Each function here is a Numba intrinsic that emits LLVM's generic vector IR
(``<16 x i32>``, ``<16 x float>``, ``llvm.vector.reduce.umax``, ``shufflevector``,
``llvm.masked.gather``) for one block of 16 consecutive values; LLVM lowers it to
whatever the host has (two 8-lane AVX2 halves here, four NEON quarters on Arm).
Why by hand: Numba's auto-vectoriser turns a 16-element block max into scalar
code, the nibble packing into strided shuffles, and table decoding into scalar
loads, and it keeps the 16-point Hadamard butterflies in memory.  Measured on one
thread of the 2-core AVX2 VM, 64 Mi float32 values: block amax 16.5 GB/s (the flat
scalar form: 13), E2M1 encode + pack 11.7 GB/s, NVFP4 decode into a reused buffer
12.7 GB/s (the scalar row kernel: 6.5); the d = 16 RHT 3.4 GB/s (the loop: 0.7).

The arithmetic is that of the scalar kernels in :mod:`fpsim._scaling_kernels`
(tested equal bit for bit, exhaustively over float32 for the encoders): plain
IEEE binary32 ``fmul``/``fadd`` with no fast-math flags, so LLVM neither contracts
them into FMAs nor flushes subnormals.  Works with typed (LLVM 14, numba 0.59) and
opaque (LLVM 15+) pointers; both were tested.

Numba's disk cache does not notice an edit here: a kernel in another module
that inlines these intrinsics keeps its cached machine code until its own file
changes (tests/conftest.py keys the test cache on all of fpsim's sources).

Contract for callers (not checked, like any raw load): the arrays are 1-D and
C-contiguous (enforced by the typing) and the 16 elements (8 packed bytes)
starting at the given index lie inside them; the row intrinsics (``err_row16``,
``moment_row16``) read 16·n elements of their rows and 16 × their lane groups
of the accumulator arrays.
"""

from __future__ import annotations

import sys

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
_F32 = ir.FloatType()
_V16I = ir.VectorType(_I32, 16)
_V8I = ir.VectorType(_I32, 8)
_V16F = ir.VectorType(_F32, 16)
_V8B = ir.VectorType(_I8, 8)
_V8L = ir.VectorType(ir.IntType(64), 8)

_MAGIC_BITS = 0x4B400000  # bits of 1.5 · 2**23 (see _scaling_kernels._e2m1_code)


def _splat(ty: ir.VectorType, value) -> ir.Constant:
    return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)


def _bcast(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """<16 x float> with every lane ``x``."""
    v = builder.insert_element(ir.Constant(_V16F, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V16F, ir.Undefined), _splat(_V16I, 0))


def _vptr(context, builder, aty, ary, index, vty: ir.VectorType) -> ir.Value:
    """Pointer to ``vty`` at element ``index`` of the 1-D array ``ary``."""
    data = context.make_array(aty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), vty.as_pointer())


def _fn(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _row(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype == dtype


def _absmax_ir(builder: ir.IRBuilder, v: ir.Value, ignore_nan: bool) -> ir.Value:
    a = builder.and_(v, _splat(_V16I, 0x7FFFFFFF))
    if ignore_nan:
        a = builder.select(builder.icmp_unsigned(">", a, _splat(_V16I, 0x7F800000)), _splat(_V16I, 0), a)
    return builder.call(_fn(builder, "llvm.vector.reduce.umax.v16i32", _I32, [_V16I]), [a])


def _absmax_typer(xr, i, ignore_nan: bool):
    if not (_row(xr, types.uint32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_vptr(context, builder, sig.args[0], args[0], args[1], _V16I), align=4)
        return _absmax_ir(builder, v, ignore_nan)

    return types.uint32(xr, i), codegen


@intrinsic
def absmax16(typingctx, xr, i):
    """Bits of max |x| over the float32 bit patterns xr[i:i+16]: an unsigned max of the bits with the sign
    cleared, so a NaN (bits above +inf) wins, like the scalar kernels' NaN-propagating amax."""
    return _absmax_typer(xr, i, False)


@intrinsic
def absmax16_nonan(typingctx, xr, i):
    """As :func:`absmax16`, NaNs counted as 0 (``nan_amax="ignore"``)."""
    return _absmax_typer(xr, i, True)


def _fmin(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """a < b ? a : b, which is x86's ``minps`` exactly (b when either is NaN)."""
    return builder.select(builder.fcmp_ordered("<", a, b), a, b)


def _e2m1_codes_ir(builder: ir.IRBuilder, y: ir.Value) -> ir.Value:
    """<16 x i32> E2M1 codes of the float32 lanes ``y`` (RNE, satfinite, NaN → 7)."""
    # E2M1's code magnitude is RNE(f(|y|)) with f = min(2a, a + 2, a/2 + 4), the three grid segments (on
    # [0, 2], [2, 4], [4, 6]) of a concave piecewise-linear map.  RNE is monotone, so RNE(min) = min(RNE):
    # each RNE is the one float32 addition of 1.5·2^23 (+2, +4) that rounds the exact 2a, a, a/2 to an
    # integer, as the scalar _e2m1_code does for the one segment it selects.  Past 2^22, and for ±inf,
    # every line is ≥ 7, so the last min (against 7) saturates; NaN fails every compare and gets 7 there.
    # The one inexact product, a/2 of a subnormal, is ≥ 4 after its addition, never below the 2a line.
    u = builder.bitcast(y, _V16I)
    af = builder.bitcast(builder.and_(u, _splat(_V16I, 0x7FFFFFFF)), _V16F)
    t1 = builder.fadd(builder.fadd(af, af), _splat(_V16F, 12582912.0))
    t2 = builder.fadd(af, _splat(_V16F, 12582914.0))
    t3 = builder.fadd(builder.fmul(af, _splat(_V16F, 0.5)), _splat(_V16F, 12582916.0))
    t = _fmin(builder, _fmin(builder, _fmin(builder, t1, t2), t3), _splat(_V16F, 12582919.0))
    c = builder.sub(builder.bitcast(t, _V16I), _splat(_V16I, _MAGIC_BITS))
    # The sign bit, but not for NaN: as signed integers, negative non-NaN floats (−0 to −inf) are exactly
    # those ≤ the bits of −inf, 0xFF800000; one compare instead of a shift, a NaN test and two masks.
    s = builder.select(builder.icmp_signed("<=", u, _splat(_V16I, -0x800000)), _splat(_V16I, 8), _splat(_V16I, 0))
    return builder.or_(c, s)


def _pack_nibbles_ir(builder: ir.IRBuilder, code: ir.Value, little: bool = sys.byteorder == "little") -> ir.Value:
    """<8 x i8>: byte j = code[2j] | code[2j+1] << 4 (codes < 16)."""
    if little:
        # Lanes 2j and 2j+1 are the low and high halves of 64-bit lane j: one shift and one or put the odd
        # code next to the even one, and the truncation keeps that byte (fewer shuffles than even/odd).
        w = builder.bitcast(code, _V8L)
        return builder.trunc(builder.or_(w, builder.lshr(w, _splat(_V8L, 28))), _V8B)
    even = builder.shuffle_vector(code, code, ir.Constant(_V8I, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(code, code, ir.Constant(_V8I, list(range(1, 16, 2))))
    return builder.trunc(builder.or_(even, builder.shl(odd, _splat(_V8I, 4))), _V8B)


@intrinsic
def e2m1_pack16(typingctx, xr, i, m, out, o):
    """out[o:o+8] = the 16 E2M1 codes of fl(xr[i+t] · m), two per byte (element 2j in the low nibble).

    The same codes as :func:`fpsim._scaling_kernels._e2m1_code` (RNE, satfinite, NaN → 7, the sign as
    bit 3), tested equal on every float32 exponent class; a different but equivalent formula, with no
    selects, that runs 25 % faster.
    """
    if not (_row(xr, types.uint32) and isinstance(i, types.Integer) and m == types.float32
            and _row(out, types.uint8) and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        xa, xi, mul, oa, oi = args
        v = builder.load(_vptr(context, builder, sig.args[0], xa, xi, _V16I), align=4)
        y = builder.fmul(builder.bitcast(v, _V16F), _bcast(builder, mul))
        byte = _pack_nibbles_ir(builder, _e2m1_codes_ir(builder, y))
        builder.store(byte, _vptr(context, builder, sig.args[3], oa, oi, _V8B), align=1)
        return context.get_dummy_value()

    return types.void(xr, i, m, out, o), codegen


@intrinsic
def e2m1_unpack16(typingctx, codes, o, sv, sd, out, i):
    """out[i:i+16] = fl(fl(e(c_t) · sv) · sd) for the 16 E2M1 codes packed in codes[o:o+8].

    The value of code c is built from its bits, as :func:`fpsim._scaling_kernels._e2m1_value`:
    magnitude m ≥ 2 is (m + 252) << 22, m = 1 is 0.5, the sign is bit 3.  ``sd`` = 1 is exact (MX).
    """
    if not (_row(codes, types.uint8) and isinstance(o, types.Integer) and sv == types.float32
            and sd == types.float32 and _row(out, types.float32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ca, ci, s1, s2, oa, oi = args
        w = builder.zext(builder.load(_vptr(context, builder, sig.args[0], ca, ci, _V8B), align=1), _V8I)
        lo = builder.and_(w, _splat(_V8I, 15))
        hi = builder.lshr(w, _splat(_V8I, 4))
        c = builder.shuffle_vector(lo, hi, ir.Constant(_V16I, [k for j in range(8) for k in (j, j + 8)]))
        m = builder.and_(c, _splat(_V16I, 7))
        big = builder.shl(builder.add(m, _splat(_V16I, 252)), _splat(_V16I, 22))
        half = builder.select(builder.icmp_signed("==", m, _splat(_V16I, 1)), _splat(_V16I, 0x3F000000),
                              _splat(_V16I, 0))
        v = builder.select(builder.icmp_signed(">=", m, _splat(_V16I, 2)), big, half)
        v = builder.or_(v, builder.shl(builder.and_(c, _splat(_V16I, 8)), _splat(_V16I, 28)))
        y = builder.fmul(builder.fmul(builder.bitcast(v, _V16F), _bcast(builder, s1)), _bcast(builder, s2))
        builder.store(y, _vptr(context, builder, sig.args[4], oa, oi, _V16F), align=4)
        return context.get_dummy_value()

    return types.void(codes, o, sv, sd, out, i), codegen


def _i32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return builder.trunc(x, _I32) if x.type.width > 32 else builder.sext(x, _I32) if x.type.width < 32 else x


def _ibcast(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """<16 x i32> with every lane the scalar integer ``x`` (truncated to 32 bits)."""
    v = builder.insert_element(ir.Constant(_V16I, ir.Undefined), _i32(builder, x), ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V16I, ir.Undefined), _splat(_V16I, 0))


@intrinsic
def elem_rne16(typingctx, xr, i, m, ea, out, o):
    """out[o:o+16] = the codes (one per byte) of fl(xr[i+t] · m) in a signed ≤ 8-bit format with subnormals.

    Lane-wise :func:`fpsim._scaling_kernels._elem_rne` (satfinite RNE, NaN → ``nan_code``), the same
    operations in the same order; ``ea`` = (mbits, 127 + emin, 1/quantum, max_code, nan_code, bits), as
    :func:`fpsim.plan.elem_path` builds it.
    """
    if not (_row(xr, types.uint32) and isinstance(i, types.Integer) and m == types.float32
            and isinstance(ea, types.BaseTuple) and len(ea) == 6 and _row(out, types.uint8)
            and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        xa, xi, mul, ea_v, oa, oi = args
        mb, emin_b, qinv, max_code, nan_code, nbits = (builder.extract_value(ea_v, k) for k in range(6))
        mb, emin_b, max_code, nan_code, nbits = (_i32(builder, x) for x in (mb, emin_b, max_code, nan_code, nbits))
        one = ir.Constant(_I32, 1)
        sh = builder.sub(ir.Constant(_I32, 23), mb)
        half = builder.sub(builder.shl(one, builder.sub(ir.Constant(_I32, 22), mb)), one)
        v = builder.load(_vptr(context, builder, sig.args[0], xa, xi, _V16I), align=4)
        u = builder.bitcast(builder.fmul(builder.bitcast(v, _V16F), _bcast(builder, mul)), _V16I)
        ab = builder.and_(u, _splat(_V16I, 0x7FFFFFFF))
        a = builder.call(_fn(builder, "llvm.umin.v16i32", _V16I, [_V16I, _V16I]), [ab, _splat(_V16I, 0x7F800000)])
        shv = _ibcast(builder, sh)
        rb = builder.lshr(builder.add(builder.add(a, _ibcast(builder, half)),
                                      builder.and_(builder.lshr(a, shv), _splat(_V16I, 1))), shv)
        cn = builder.sub(rb, _ibcast(builder, builder.shl(builder.sub(emin_b, one), mb)))
        t = builder.fadd(builder.fmul(builder.bitcast(a, _V16F), _bcast(builder, qinv)), _splat(_V16F, 12582912.0))
        k = builder.sub(builder.bitcast(t, _V16I), _splat(_V16I, _MAGIC_BITS))
        sub = builder.icmp_unsigned("<", a, _ibcast(builder, builder.shl(emin_b, ir.Constant(_I32, 23))))
        mag = builder.call(_fn(builder, "llvm.smin.v16i32", _V16I, [_V16I, _V16I]),
                           [builder.select(sub, k, cn), _ibcast(builder, max_code)])
        s = builder.shl(builder.lshr(u, _splat(_V16I, 31)), _ibcast(builder, builder.sub(nbits, one)))
        code = builder.select(builder.icmp_unsigned(">", ab, _splat(_V16I, 0x7F800000)), _ibcast(builder, nan_code),
                              builder.or_(mag, s))
        byte = builder.trunc(code, ir.VectorType(_I8, 16))
        builder.store(byte, _vptr(context, builder, sig.args[4], oa, oi, ir.VectorType(_I8, 16)), align=1)
        return context.get_dummy_value()

    return types.void(xr, i, m, ea, out, o), codegen


_V16B = ir.VectorType(_I8, 16)
_V16L = ir.VectorType(ir.IntType(64), 16)
_V16M = ir.VectorType(ir.IntType(1), 16)


@intrinsic
def table_decode16(typingctx, codes, o, table, sv, sd, out, i):
    """out[i:i+16] = fl(fl(table[codes[o+t]] · sv) · sd): one-byte codes through a 256-entry float32 table.

    One masked gather (``vpgatherdd`` on AVX2) instead of 16 scalar loads; ``table`` must have 256 entries.
    """
    if not (_row(codes, types.uint8) and isinstance(o, types.Integer) and _row(table, types.float32)
            and sv == types.float32 and sd == types.float32 and _row(out, types.float32)
            and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ca, ci, ta, s1, s2, oa, oi = args
        c = builder.zext(builder.load(_vptr(context, builder, sig.args[0], ca, ci, _V16B), align=1), _V16L)
        # Vector addresses by integer arithmetic: llvmlite's GEP takes no vector index.
        base = builder.ptrtoint(context.make_array(sig.args[2])(context, builder, ta).data, ir.IntType(64))
        base = builder.insert_element(ir.Constant(_V16L, ir.Undefined), base, ir.Constant(_I32, 0))
        base = builder.shuffle_vector(base, ir.Constant(_V16L, ir.Undefined), _splat(_V16I, 0))
        ptr_t = _F32.as_pointer()
        ptrs = builder.inttoptr(builder.add(base, builder.shl(c, _splat(_V16L, 2))), ir.VectorType(ptr_t, 16))
        # The overloaded name spells the pointer type: "p0" with LLVM's opaque pointers, "p0f32" before them.
        name = "llvm.masked.gather.v16f32.v16" + ("p0" if str(ptr_t) == "ptr" else "p0f32")
        gather = _fn(builder, name, _V16F, [ptrs.type, _I32, _V16M, _V16F])
        g = builder.call(gather, [ptrs, ir.Constant(_I32, 4), _splat(_V16M, 1), ir.Constant(_V16F, ir.Undefined)])
        y = builder.fmul(builder.fmul(g, _bcast(builder, s1)), _bcast(builder, s2))
        builder.store(y, _vptr(context, builder, sig.args[5], oa, oi, _V16F), align=4)
        return context.get_dummy_value()

    return types.void(codes, o, table, sv, sd, out, i), codegen


def _bf16_round_ir(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<16 x float> rounded to BF16 values (RNE; NaN → 0x7FC00000; inf kept), as fpsim.transforms._bf16_round."""
    b = builder.bitcast(v, _V16I)
    r = builder.add(builder.add(b, _splat(_V16I, 0x7FFF)), builder.and_(builder.lshr(b, _splat(_V16I, 16)),
                                                                         _splat(_V16I, 1)))
    r = builder.and_(r, _splat(_V16I, 0xFFFF0000))
    nan = builder.icmp_unsigned(">", builder.and_(b, _splat(_V16I, 0x7FFFFFFF)), _splat(_V16I, 0x7F800000))
    return builder.bitcast(builder.select(nan, _splat(_V16I, 0x7FC00000), r), _V16F)


def _butterfly_ir(builder: ir.IRBuilder, v: ir.Value, h: int) -> ir.Value:
    """One Walsh–Hadamard stage on 16 lanes: lanes j and j + h of every 2h-group become (a + b, a − b)."""
    lo = [j for j in range(16) if not j & h]
    a = builder.shuffle_vector(v, v, ir.Constant(_V8I, lo))
    b = builder.shuffle_vector(v, v, ir.Constant(_V8I, [j + h for j in lo]))
    mask = [lo.index(j) if not j & h else 8 + lo.index(j - h) for j in range(16)]
    return builder.shuffle_vector(builder.fadd(a, b), builder.fsub(a, b), ir.Constant(_V16I, mask))


@intrinsic
def rht16(typingctx, src, i, signs, scale, flags, dst, o):
    """dst[o:o+16] = the random Hadamard transform of the tile src[i:i+16] (d = 16), as fpsim.transforms.

    ``flags``: bit 0 rounds the input to BF16, bit 1 the output, bit 2 multiplies by the signs before the
    butterflies (the forward transform), bit 3 after them (the inverse).  The operations are those of the
    scalar loop in :mod:`fpsim.transforms`, in its order: BF16 input rounding, signs, stages h = 1, 2, 4, 8
    mapping (a, b) to (a + b, a − b), one multiply by ``scale``, the inverse's signs, BF16 output rounding;
    ``signs`` holds 16 float32 ±1.
    """
    if not (_row(src, types.float32) and isinstance(i, types.Integer) and _row(signs, types.float32)
            and scale == types.float32 and isinstance(flags, types.Integer) and _row(dst, types.float32)
            and isinstance(o, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        sa, si, ga, sc, fl, da, do = args
        fl = _i32(builder, fl)

        def flag(bit):
            return builder.icmp_unsigned("!=", builder.and_(fl, ir.Constant(_I32, bit)), ir.Constant(_I32, 0))

        bf_in, bf_out, before, after = flag(1), flag(2), flag(4), flag(8)
        zero = context.get_constant(types.intp, 0)
        s = builder.load(_vptr(context, builder, sig.args[2], ga, zero, _V16F), align=4)
        v = builder.load(_vptr(context, builder, sig.args[0], sa, si, _V16F), align=4)
        v = builder.select(bf_in, _bf16_round_ir(builder, v), v)
        v = builder.select(before, builder.fmul(v, s), v)
        for h in (1, 2, 4, 8):
            v = _butterfly_ir(builder, v, h)
        v = builder.fmul(v, _bcast(builder, sc))
        v = builder.select(after, builder.fmul(v, s), v)
        v = builder.select(bf_out, _bf16_round_ir(builder, v), v)
        builder.store(v, _vptr(context, builder, sig.args[5], da, do, _V16F), align=4)
        return context.get_dummy_value()

    return types.void(src, i, signs, scale, flags, dst, o), codegen


# ---------------------------------------------------------------------------
# Lanes of float64 and int64 sums for fpsim.analysis (the error and moment sums of fpsim._analysis_kernels):
# element c of a row goes to lane c mod 16, each lane adds in element order (so the sums are the same on every
# machine), the accumulators stay in registers for the whole row (allocas that LLVM promotes), where Numba's
# auto-vectoriser leaves an in-order float64 sum scalar, one element per addition latency.

#: float64 lane groups of ``facc`` (16 lanes each): Σx², Σd², Σd, max|d|, bulk Σx², bulk Σd².
F_LANES = 6
#: int64 lane groups of ``kacc`` (16 lanes each): measured, measured non-zero, flushed, x finite with x̂ not,
#: saturated.
K_LANES = 5

_F64 = ir.DoubleType()
_I64 = ir.IntType(64)
_V16D = ir.VectorType(_F64, 16)


def _dbcast(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """<16 x double> with every lane ``x``."""
    v = builder.insert_element(ir.Constant(_V16D, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(_V16D, ir.Undefined), _splat(_V16I, 0))


def _codes16(context, builder, aty, ary, i, packed: bool) -> ir.Value:
    """<16 x i32>: the codes of elements 16i … 16i + 15 (two per byte, element 2j in the low nibble, or one per
    byte)."""
    if packed:
        w = builder.zext(builder.load(_vptr(context, builder, aty, ary, builder.mul(i, ir.Constant(i.type, 8)),
                                            _V8B), align=1), _V8I)
        lo = builder.and_(w, _splat(_V8I, 15))
        hi = builder.lshr(w, _splat(_V8I, 4))
        return builder.shuffle_vector(lo, hi, ir.Constant(_V16I, [k for j in range(8) for k in (j, j + 8)]))
    b = builder.load(_vptr(context, builder, aty, ary, builder.mul(i, ir.Constant(i.type, 16)), _V16B), align=1)
    return builder.zext(b, _V16I)


def _lane_loop(context, builder, n, fty, fa, ka, nf: int, nk: int, body) -> None:
    """Load ``nf`` <16 x double> and ``nk`` <16 x i64> accumulators from the arrays ``fa`` (type ``fty[0]``) and
    ``ka`` (``fty[1]``), run ``body(i, f, k)`` → (f, k) for i in [0, n) with them in registers (allocas that LLVM
    promotes), store them back."""
    fptr = [_vptr(context, builder, fty[0], fa, ir.Constant(_I64, 16 * j), _V16D) for j in range(nf)]
    kptr = [_vptr(context, builder, fty[1], ka, ir.Constant(_I64, 16 * j), _V16L) for j in range(nk)]
    slots = [cgutils.alloca_once(builder, _V16D) for _ in range(nf)] + [cgutils.alloca_once(builder, _V16L)
                                                                         for _ in range(nk)]
    for src, dst in zip(fptr + kptr, slots):
        builder.store(builder.load(src, align=8), dst)
    with cgutils.for_range(builder, n) as loop:
        vals = [builder.load(p) for p in slots]
        f, k = body(loop.index, vals[:nf], vals[nf:])
        for v, p in zip(list(f) + list(k), slots):
            builder.store(v, p)
    for src, dst in zip(slots, fptr + kptr):
        builder.store(builder.load(src), dst, align=8)


def _typer(codes_mode: int):
    """The typer of an intrinsic (x, xq, codes, n, bound, mag_mask, max_code, facc, kacc); ``codes_mode`` 0: no
    codes (saturated lanes untouched), 1: packed nibbles, 2: one code per byte."""

    def typer(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc):
        if not (_row(x, types.float32) and _row(xq, types.float32) and _row(codes, types.uint8)
                and isinstance(n, types.Integer) and bound == types.float64 and isinstance(mag, types.Integer)
                and isinstance(mx, types.Integer) and _row(facc, types.float64) and _row(kacc, types.int64)):
            return None

        def codegen(context, builder, sig, args):
            xa, qa, ca, n_v, bnd, mag_v, mx_v, fa, ka = args
            at = sig.args
            fabs_d = _fn(builder, "llvm.fabs.v16f64", _V16D, [_V16D])
            fabs_f = _fn(builder, "llvm.fabs.v16f32", _V16F, [_V16F])
            inf_d, zero_d = _splat(_V16D, float("inf")), _splat(_V16D, 0.0)
            inf_f, zero_f = _splat(_V16F, float("inf")), _splat(_V16F, 0.0)
            bound_v = _dbcast(builder, bnd)

            def body(i, f, k):
                off = builder.mul(i, ir.Constant(i.type, 16))
                xv = builder.load(_vptr(context, builder, at[0], xa, off, _V16F), align=4)
                qv = builder.load(_vptr(context, builder, at[1], qa, off, _V16F), align=4)
                a, b = builder.fpext(xv, _V16D), builder.fpext(qv, _V16D)
                fin_a = builder.fcmp_ordered("<", builder.call(fabs_d, [a]), inf_d)
                m = builder.and_(fin_a, builder.fcmp_ordered("<", builder.call(fabs_d, [b]), inf_d))
                am = builder.select(m, a, zero_d)
                d = builder.select(m, builder.fsub(a, b), zero_d)
                nonzero = builder.and_(m, builder.fcmp_ordered("!=", a, zero_d))
                a2, d2 = builder.fmul(am, am), builder.fmul(d, d)
                ad = builder.call(fabs_d, [d])
                inb = builder.fcmp_ordered("<=", builder.call(fabs_d, [am]), bound_v)
                f = [builder.fadd(f[0], a2), builder.fadd(f[1], d2), builder.fadd(f[2], d),
                     builder.select(builder.fcmp_ordered(">", ad, f[3]), ad, f[3]),
                     builder.fadd(f[4], builder.select(inb, a2, zero_d)),
                     builder.fadd(f[5], builder.select(inb, d2, zero_d))]
                counts = [m, nonzero, builder.and_(nonzero, builder.fcmp_ordered("==", b, zero_d)),
                          builder.and_(fin_a, builder.not_(m))]
                if codes_mode:
                    c = _codes16(context, builder, at[2], ca, i, codes_mode == 1)
                    v = builder.call(fabs_f, [qv])
                    top = builder.icmp_signed("==", builder.and_(c, _ibcast(builder, mag_v)), _ibcast(builder, mx_v))
                    sat = builder.and_(builder.and_(top, builder.fcmp_ordered(">", v, zero_f)),
                                       builder.and_(builder.fcmp_ordered("<", v, inf_f),
                                                    builder.fcmp_ordered(">", builder.call(fabs_f, [xv]), v)))
                    counts.append(sat)
                k = [builder.add(old, builder.zext(t, _V16L)) for old, t in zip(k, counts)] + k[len(counts):]
                return f, k

            _lane_loop(context, builder, n_v, (at[7], at[8]), fa, ka, F_LANES, K_LANES, body)
            return context.get_dummy_value()

        return types.void(x, xq, codes, n, bound, mag, mx, facc, kacc), codegen

    return typer


@intrinsic
def moment_row16(typingctx, x, n, mean, facc, kacc):
    """Add elements 0 … 16·n − 1 of the float32 row ``x`` to the lanes of ``facc`` (5 × 16 float64: Σv, Σd², Σd⁴
    with d = v − ``mean``, min v, max v over the finite v) and ``kacc`` (3 × 16 int64: #finite, #NaN, #±inf).
    A non-finite element adds +0.0 and leaves min and max as they are."""
    if not (_row(x, types.float32) and isinstance(n, types.Integer) and mean == types.float64
            and _row(facc, types.float64) and _row(kacc, types.int64)):
        return None

    def codegen(context, builder, sig, args):
        xa, n_v, mean_v, fa, ka = args
        at = sig.args
        fabs_d = _fn(builder, "llvm.fabs.v16f64", _V16D, [_V16D])
        inf_d, zero_d = _splat(_V16D, float("inf")), _splat(_V16D, 0.0)
        mean_b = _dbcast(builder, mean_v)

        def body(i, f, k):
            off = builder.mul(i, ir.Constant(i.type, 16))
            v = builder.fpext(builder.load(_vptr(context, builder, at[0], xa, off, _V16F), align=4), _V16D)
            fin = builder.fcmp_ordered("<", builder.call(fabs_d, [v]), inf_d)
            nan = builder.fcmp_unordered("uno", v, v)
            vm = builder.select(fin, v, zero_d)
            dv = builder.fsub(v, mean_b)
            d2 = builder.select(fin, builder.fmul(dv, dv), zero_d)
            f = [builder.fadd(f[0], vm), builder.fadd(f[1], d2), builder.fadd(f[2], builder.fmul(d2, d2)),
                 builder.select(builder.and_(fin, builder.fcmp_ordered("<", v, f[3])), v, f[3]),
                 builder.select(builder.and_(fin, builder.fcmp_ordered(">", v, f[4])), v, f[4])]
            inf = builder.and_(builder.not_(fin), builder.not_(nan))
            k = [builder.add(old, builder.zext(t, _V16L)) for old, t in zip(k, (fin, nan, inf))]
            return f, k

        _lane_loop(context, builder, n_v, (at[3], at[4]), fa, ka, 5, 3, body)
        return context.get_dummy_value()

    return types.void(x, n, mean, facc, kacc), codegen


@intrinsic
def err_row16(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc):
    """Add elements 0 … 16·n − 1 of the float32 rows ``x`` and ``xq`` (x̂) to the lanes of ``facc`` (F_LANES × 16
    float64) and ``kacc`` (the first four of K_LANES × 16 int64); ``codes``, ``mag``, ``mx`` are not read."""
    return _typer(0)(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc)


@intrinsic
def err_row16_nibbles(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc):
    """As :func:`err_row16`, and the saturated lanes: (code & ``mag``) == ``mx`` with x̂ finite and non-zero and
    |x| > |x̂|, the codes two per byte of ``codes`` (element 2j in the low nibble)."""
    return _typer(1)(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc)


@intrinsic
def err_row16_bytes(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc):
    """As :func:`err_row16_nibbles`, one code per byte."""
    return _typer(2)(typingctx, x, xq, codes, n, bound, mag, mx, facc, kacc)


@intrinsic
def absmin_nonzero16(typingctx, xr, i):
    """Bits of the smallest non-zero |x| over the float32 bit patterns xr[i:i+16] (an unsigned min of the bits with
    the sign cleared, zeros left out): 0xFFFFFFFF when all 16 are ±0; a NaN (bits above +inf) is the result only
    when every other element is zero."""
    if not (_row(xr, types.uint32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        v = builder.load(_vptr(context, builder, sig.args[0], args[0], args[1], _V16I), align=4)
        a = builder.and_(v, _splat(_V16I, 0x7FFFFFFF))
        a = builder.select(builder.icmp_unsigned("==", a, _splat(_V16I, 0)), _splat(_V16I, -1), a)
        return builder.call(_fn(builder, "llvm.vector.reduce.umin.v16i32", ir.IntType(32), [_V16I]), [a])

    return types.uint32(xr, i), codegen
