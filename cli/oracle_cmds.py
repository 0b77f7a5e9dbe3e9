"""``fpsim explain``, ``fpsim diff``, ``fpsim vectors``: fpsim as a reference oracle (see docs/oracle.md).

Results on stdout, one-line messages on stderr, never a traceback.  Exit codes:

* ``explain`` / ``vectors``: 0 ok; 1 the input file could not be used; 2 usage
  (unknown format or scheme, unparsable value, bad option);
* ``diff``: 0 identical; 1 different; 2 usage or unusable input (missing or
  pickled file, wrong key names, wrong shapes, an option the scheme does not have);
* every command: 3 internal error; 4 stdout could not be written; 130 Ctrl-C; 141 stdout closed (cli/main.py).

Every message is one line starting ``error:`` (as in ``cli/main.py``).  An unexpected exception — a bug in
fpsim, not a bad input — is one line ``error: internal error …`` and exit 3: never the usage code 2, and never
``diff``'s 1, which a script reads as "the bytes differ"; ``diff`` then prints no verdict on stdout.

JSON output follows fpsim's one convention (``fpsim.io.dumps``): numbers are JSON numbers or ``null``
(NaN, ±inf), with a ``hex`` or ``class`` field beside each float that says which.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from pathlib import Path

import click
import numpy as np

#: Exit code of an unexpected exception: distinct from diff's 1 ("different") and from 2 (usage).
INTERNAL_ERROR = 3


def _given(param: str) -> bool:
    """Whether the option was on the command line (not its default)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(param) not in (ParameterSource.DEFAULT, None)


def _fail(msg: str, code: int) -> None:
    click.echo(f"error: {msg}", err=True)
    click.get_current_context().exit(code)


def _internal(e: BaseException) -> None:
    """An unexpected exception (fpsim's bug, not the user's input): one line, exit 3 (:data:`INTERNAL_ERROR`)."""
    from fpsim.oracle import DiagnosisError
    from fpsim.oracle.common import exception_line

    if isinstance(e, DiagnosisError):
        _fail(f"internal error: {str(e).splitlines()[0]}", INTERNAL_ERROR)
    _fail(f"internal error ({exception_line(e)}): a bug in fpsim; please report it", INTERNAL_ERROR)


def _parse_value(s: str) -> np.float32:
    """A decimal / 'nan' / 'inf' value, or 0x… float32 bits."""
    t = s.strip().lower()
    if t.startswith(("0x", "-0x", "+0x")) and not any(ch in t for ch in ".p"):
        bits = int(t, 16)
        if not 0 <= bits < 1 << 32:
            raise ValueError(f"{s!r}: float32 bits must be 0x00000000..0xFFFFFFFF")
        return np.float32(struct.unpack("<f", struct.pack("<I", bits))[0])
    if t.startswith(("0x", "-0x", "+0x")):
        return np.float32(float.fromhex(t))
    return _decimal_f32(t)


def _decimal_f32(t: str) -> np.float32:
    """A decimal rounded once to float32 (RNE, docs/oracle.md).  float(t) then float32 rounds twice: a decimal just
    above a float32 midpoint can land on it in float64 and then tie to even (1.000000059604644775390625000001 → 1.0,
    not 1 + 2^-23).  Rounding to float64 by round-to-odd instead makes the float32 rounding exact (53 ≥ 24 + 2 bits)."""
    x = float(t)
    if math.isfinite(x):
        try:
            exact = Fraction(t)
        except ValueError:  # a spelling float() takes and Fraction does not: keep float()'s value
            exact = Fraction(x)
        if Fraction(x) != exact and not int(np.float64(x).view(np.uint64)) & 1:
            x = math.nextafter(x, math.inf if exact > Fraction(x) else -math.inf)  # the odd neighbour
    with np.errstate(over="ignore"):  # beyond float32: inf, as RNE gives
        return np.float32(x)


def _number_arg(text: str) -> np.float32:
    """VALUE or --scale as float32; exit 2 naming the argument that cannot be read (each is parsed on its own)."""
    try:
        return _parse_value(text)
    except ValueError:
        _fail(f"cannot read {text!r} as a number (decimal, nan, inf or 0x… bits)", 2)
    raise AssertionError("unreachable: _fail exits")


def _dump_json(obj) -> None:
    from fpsim.io import dumps

    click.echo(dumps(obj, indent=2), nl=False)


def _g(v) -> str:
    return f"{v:.9g}" if isinstance(v, float) else str(v)


def _print_value(d: dict) -> None:
    def f32line(label, f):
        ue = f["unbiased_exponent"]
        exp = f"exponent field {f['exponent_field']}" + (f" (2^{ue})" if ue is not None else "")
        click.echo(f"{label:<9} {_g(f['value']):<16} float32 {f['hex']}  sign {f['sign']}  {exp}  "
                   f"mantissa {f['mantissa_field']}  {f['class']}")

    bits = f" (k = {d['k']} random bits)" if "k" in d else ""
    click.echo(f"format    {d['format']}  rounding {d['rounding']}{bits}  saturate {d['saturate']}")
    f32line("input", d["input"])
    if "scale" in d:
        f32line("scale", d["scale"])
        f32line("scaled", d["scaled"])
    for k in ("below", "above"):
        p = d[k]
        if p is not None:
            code = f"code {p['hex']}" if p["code"] is not None else p.get("note", "")
            click.echo(f"{k:<9} {_g(p['value']):<16} {code}")
    if d["position"]:
        p = d["position"]
        click.echo(f"position  {_g(p['fraction_of_step'])} of the step  (round bit {p['round_bit']}, "
                   f"sticky bits {'≠ 0' if p['sticky'] else '0'})")
    click.echo(f"rule      {d['rule']}")
    for n in d["notes"]:
        click.echo(f"          {n}")
    r = d["result"]
    if r is None:  # stochastic rounding without a draw: both outcomes
        for o in d["outcomes"]:
            click.echo(f"outcome   code {o['hex']}  → {_g(o['value'])}  with probability {_g(o['probability'])}")
        return
    click.echo(f"result    code {r['hex']} = 0b{r['binary']}  → {_g(r['value'])}")


def _print_block(d: dict) -> None:
    click.echo(f"scheme {d['scheme']}  block {tuple(d['block']) if d['block'] else 'tensor'}")
    click.echo(f"{'step':<22} {'value':<18} {'hex':<11} formula")
    for s in d["steps"]:
        click.echo(f"{s['name']:<22} {_g(s['value']):<18} {s['hex']:<11} {s['formula']}")
    click.echo(f"elements: scaled = {d['element_formula']}; decoded = {d['decode_formula']}")
    click.echo(f"{'i':>3} {'x':>15} {'x hex':<11} {'scaled':>15} {'scaled hex':<11} {'code':<5} {'bits':<12} decoded")
    for e in d["elements"]:
        click.echo(f"{e['index']:>3} {_g(e['x']):>15} {e['x_hex']:<11} {_g(e['scaled']):>15} {e['scaled_hex']:<11} "
                   f"{e['code_hex']:<5} {e['code_binary']:<12} {_g(e['decoded'])}")
    click.echo(f"agrees with fpsim.quantize: {'yes' if d['agrees_with_quantize'] else 'NO (please report)'}")


def _pick(arrays: dict, name: str | None, path: str, defaults=("x", "input")) -> np.ndarray:
    if name:
        if name not in arrays:
            raise ValueError(f"{path}: no array {name!r} (has: {', '.join(sorted(arrays)) or 'none'})")
        return arrays[name]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    for k in defaults:
        if k in arrays:
            return arrays[k]
    raise ValueError(f"{path}: several arrays ({', '.join(sorted(arrays))}); name one as FILE:NAME")


def _block_index(idx: str) -> list[int]:
    """--block's IDX: [flat] or [row, block]; unreadable, exit 2 (an option value, whatever the file holds)."""
    try:
        index = [int(s) for s in idx.split(",")]
    except ValueError:
        index = []
    if len(index) not in (1, 2):
        _fail(f"block index {idx!r}: use an integer or ROW,BLOCK", 2)
    return index


def _split_ref(ref: str) -> tuple[str, str | None]:
    """FILE or FILE:NAME (a path that exists as given wins)."""
    if Path(ref).is_file() or ":" not in ref:
        return ref, None
    f, n = ref.rsplit(":", 1)
    return f, n or None


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("value", required=False)
@click.option("--format", "fmt", default=None, help="Element format of VALUE (e2m1, e4m3, e8m0, …).")
@click.option("--scale", default=None, help="Multiplier applied before encoding: the code is of fl(VALUE·scale).")
@click.option("--rounding", default="rne", show_default=True, help="rne, rtz, rup, rdown, rna or sr (stochastic).")
@click.option("--sr-bits", "sr_bits", type=int, default=None,
              help="--rounding sr: random bits k (default the format's).")
@click.option("--random", "r", type=int, default=None, metavar="R",
              help="--rounding sr: the random value r (0 ≤ r < 2^k) of one draw; without it, both outcomes and their "
                   "probabilities.")
@click.option("--no-saturate", is_flag=True, help="__NV_NOSAT: overflow to inf/NaN instead of ±max.")
@click.option("--block", "block_ref", default=None, metavar="FILE:NAME:IDX",
              help="Explain block IDX (flat, or ROW,BLOCK) of array NAME in a .npz/.npy/.safetensors file.")
@click.option("--scheme", default="nvfp4", show_default=True, help="Block scheme for --block.")
@click.option("--axis", default=-1, show_default=True, help="Quantized axis for --block.")
@click.option("--json", "as_json", is_flag=True, help="JSON output (NaN and ±inf as null, with their hex bits beside).")
def explain(value, fmt, scale, rounding, sr_bits, r, no_saturate, block_ref, scheme, axis, as_json) -> None:
    """Explain one conversion (VALUE --format F) or one block (--block FILE:NAME:IDX --scheme S), step by step.

    VALUE is a decimal, nan, inf, or 0x… float32 bits (e.g. 0x3F400000).
    """
    from fpsim.oracle import explain_block, explain_value, load_arrays

    mine = (("--format", "fmt"), ("--scale", "scale"), ("--rounding", "rounding"), ("--sr-bits", "sr_bits"),
            ("--random", "r"), ("--no-saturate", "no_saturate")) if block_ref is not None else \
        (("--scheme", "scheme"), ("--axis", "axis"))
    ignored = [o for o, n in mine if _given(n)]  # an option the other mode takes would be ignored: refused
    if ignored:
        _fail(f"{', '.join(ignored)}: for {'VALUE, not --block' if block_ref is not None else '--block, not VALUE'}", 2)
    if block_ref is not None:
        if value is not None:
            _fail("give either VALUE or --block, not both", 2)
        from fpsim.schemes import get_scheme

        try:
            sch = get_scheme(scheme)
        except ValueError as e:
            _fail(str(e), 2)
        if sch.block is None or sch.block[0] != 1:  # an option refusal (usage, 2), not an unusable file (1)
            _fail(f"--block explains 1-D blocks; {sch.name} has block {sch.block}", 2)
        parts = block_ref.rsplit(":", 2)
        if len(parts) != 3:
            _fail(f"--block needs FILE:NAME:IDX, got {block_ref!r}", 2)
        path, name, idx = parts
        index = _block_index(idx)
        try:
            arr = _pick(load_arrays(path), name or None, path)
            x = np.asarray(arr)
            if (x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16") or x.ndim == 0:
                raise ValueError(f"{path}:{name}: need a real array with at least one axis, got {x.dtype} {x.shape}")
            x = x.astype(np.float32)
            if not -x.ndim <= axis < x.ndim:
                raise ValueError(f"axis {axis} out of range for shape {x.shape}")
            X = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
            R, C = X.shape
            BC = sch.block[1]
            nb = -(-C // BC)
            r, j = divmod(index[0], nb) if len(index) == 1 else index
            if not (0 <= r < R and 0 <= j < nb):
                raise ValueError(f"block ({r}, {j}) out of range: {R} rows × {nb} blocks")
            with np.errstate(all="ignore"):
                amax = np.float32(np.max(np.abs(x))) if x.size else np.float32(0)
            d = explain_block(X[r, j * BC : (j + 1) * BC], sch, tensor_amax=amax if sch.tensor_scale else None)
        except ValueError as e:
            _fail(str(e), 1)
        except Exception as e:
            _internal(e)
        d["block_index"] = [r, j]
        _dump_json(d) if as_json else _print_block(d)
        return
    if value is None:
        _fail("give VALUE (with --format) or --block FILE:NAME:IDX", 2)
    if fmt is None:
        _fail("explain VALUE needs --format (e.g. --format e2m1)", 2)
    v = _number_arg(value)
    s = None if scale is None else _number_arg(scale)
    try:
        d = explain_value(v, fmt, rounding=rounding, saturate=not no_saturate, scale=s, k=sr_bits, r=r)
    except ValueError as e:
        _fail(str(e), 2)
    except Exception as e:
        _internal(e)
    _dump_json(d) if as_json else _print_value(d)


def _read_raw(path: str, dtype, what: str) -> np.ndarray:
    from fpsim.oracle.common import check_load_size

    p = Path(path)
    if not p.is_file():
        why = ("a directory" if p.is_dir() else "not a regular file" if p.exists()
               else "broken symbolic link" if p.is_symlink() else "no such file")
        raise ValueError(f"{path}: {why} ({what})")
    check_load_size(f"{path} ({what})", p.stat().st_size)  # before reading it whole
    raw = p.read_bytes()
    dt = np.dtype(dtype).newbyteorder("<")
    if len(raw) % dt.itemsize:
        raise ValueError(f"{path}: {len(raw)} bytes is not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(raw, dt).astype(np.dtype(dtype))


def _scheme_options(f):
    """The scheme options shared by ``diff`` and ``vectors`` (each changes one field of --scheme)."""
    opts = [
        click.option("--scale-rule", default=None, help="MX E8M0 scale rule: floor, ceil, even or rceil (default)."
                     + (" vectors: also 'all'." if f.__name__ == "vectors" else "")),
        click.option("--block", "block", default=None, metavar="RxC", help="Block shape, e.g. 16x16 or 1x16."),
        click.option("--tensor-scale/--no-tensor-scale", "tensor_scale", default=None,
                     help="Two-level schemes: keep or drop the FP32 tensor scale (--no-tensor-scale: single-level)."),
        click.option("--per-row-scale", is_flag=True, help="Two-level schemes: a second-level scale per row."),
        click.option("--four-over-six", "four_over_six", type=click.Choice(["mse", "mae"]), default=None,
                     help="NVFP4 four-over-six, choosing per block by this error metric."),
        click.option("--nan-amax", type=click.Choice(["propagate", "ignore"]), default="propagate",
                     show_default=True, help="NaN in an amax propagates (SPEC §9) or is ignored (fmaxf)."),
        click.option("--scale-min", default=None, metavar="V",
                     help="Two-level schemes: clamp the block scale to ≥ V before encoding (torchao: 2^-6)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _number(s: str, what: str) -> float:
    """A finite float32 value ≥ 0, also written as 2^-6 or 2**-6; else exit 2 (NaN, ±inf, a negative clamp or one
    beyond float32 would be accepted and mean nothing, 10^999 overflowed with a traceback)."""
    t = s.strip().replace("**", "^")
    try:
        if "^" in t:
            b, e = t.split("^")
            v = math.copysign(abs(float(b)) ** float(e), float(b))  # -2^-6 is -(2^-6), not (-2)^-6 = +2^-6
        else:
            v = float(t)
    except (ValueError, OverflowError, ZeroDivisionError):
        v = math.nan
    if not 0 <= v <= float(np.finfo(np.float32).max):  # NaN fails this too
        _fail(f"{what} {s!r}: give a finite number ≥ 0 within float32's range, such as 0.015625 or 2^-6", 2)
    return v


def _build_scheme(scheme, scale_rule, block, tensor_scale, per_row_scale, four_over_six, allow_all=False):
    """The scheme with the options applied (its name lists them); a bad combination fails with exit 2."""
    from fpsim.schemes import Kind, ScaleRule, get_scheme

    try:
        sch = get_scheme(scheme)
        changes, tags = {}, []
        if scale_rule is not None:
            if not (allow_all and scale_rule == "all"):
                ScaleRule.parse(scale_rule)  # an unknown rule is named as such, whatever the scheme
            if sch.kind is not Kind.POW2:
                raise ValueError(f"--scale-rule applies to MX (E8M0-scaled) schemes, not {sch.name}")
        if scale_rule is not None and not (allow_all and scale_rule == "all"):
            changes["scale_rule"], tags = scale_rule, tags + [scale_rule]
        if block is not None:
            try:
                br, bc = (int(v) for v in block.lower().replace(",", "x").split("x"))
            except ValueError:
                raise ValueError(f"--block {block!r}: use RxC, e.g. 16x16") from None
            changes["block"], tags = (br, bc), tags + [f"{br}x{bc}"]
        if tensor_scale is not None:
            changes["tensor_scale"], tags = tensor_scale, tags + ["tensor-scale" if tensor_scale else "single-level"]
        if per_row_scale:
            changes["per_row_scale"], tags = True, tags + ["per-row"]
        if four_over_six is not None:
            changes["four_over_six"], changes["four_over_six_metric"] = True, four_over_six
            tags.append(f"4/6-{four_over_six}")
        if changes:
            sch = sch.replace(name="+".join([sch.name] + tags), **changes)
        return sch
    except (ValueError, TypeError) as e:
        _fail(str(e).splitlines()[0], 2)


@click.command()
@click.argument("candidate", required=False)
@click.option("--input", "input_ref", default=None, metavar="FILE[:NAME]",
              help="The input both sides quantized (.npz/.npy/.safetensors; default key x or input).")
@click.option("--scheme", default="nvfp4", show_default=True, help="Block scheme (nvfp4, mxfp4, mxfp8_e4m3, …).")
@click.option("--axis", default=-1, show_default=True, help="The quantized axis.")
@click.option("--show", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many mismatches of each kind to list.")
@click.option("--format", "out_format", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--raw-codes", default=None, metavar="FILE.bin", help="Raw candidate code bytes (instead of CANDIDATE).")
@click.option("--raw-scales", default=None, metavar="FILE.bin", help="Raw candidate scale bytes (little-endian).")
@click.option("--shape", default=None, help="Shape of the raw codes, e.g. 4,32 (default: rows of the input).")
@click.option("--swizzled", is_flag=True, help="Candidate scales are in the Blackwell swizzled layout.")
@click.option("--unpacked", is_flag=True, help="4-bit candidate codes are one per byte (not two).")
@click.option("--rounding", type=click.Choice(["rne", "sr"]), default="rne", show_default=True,
              help="The candidate's element rounding; sr: stochastic (fpsim's bits with --seed; without, every code "
                   "checked against the two neighbours of x·enc_b and the away-roundings tested for bias).")
@click.option("--seed", type=int, default=None, help="--rounding sr: the seed of fpsim's Philox stream (SPEC §3).")
@click.option("--sr-bits", type=click.IntRange(1, 24), default=None,
              help="--rounding sr: random bits per element K (default the scheme's, 8 for NVFP4).")
@click.option("--rht", is_flag=True,
              help="fpsim quantizes the random-Hadamard-transformed input, as the recipe's Wgrad operands (SPEC §7: "
                   "16-point tiles along --axis, the recipe's signs, BF16 in and out).")
@click.option("--reference", default=None, metavar="ORIGINAL",
              help="CANDIDATE is a producer's NVFP4 checkpoint (folder or .safetensors): compare each quantized "
                   "tensor with fpsim's quantization of ORIGINAL's tensor of that name.")
@click.option("--tensor", default=None, metavar="NAME", help="With --reference: only this quantized tensor.")
@_scheme_options
def diff(candidate, input_ref, scheme, axis, show, out_format, raw_codes, raw_scales, shape, swizzled, unpacked,
         rounding, seed, sr_bits, rht, scale_rule, block, tensor_scale, per_row_scale, four_over_six, nan_amax,
         scale_min, reference, tensor):
    """Compare a kernel's codes and scales with fpsim's; exit 0 identical, 1 different, 2 bad input.

    CANDIDATE is a .npz or .safetensors file with the keys ``codes`` (uint8,
    quantized axis last, 4-bit codes packed two per byte, element 2j in the low
    nibble), ``scales`` (raw scale bytes [rows, blocks]; float32 for FP32
    scales) and optionally ``amax`` (float32); or give --raw-codes and
    --raw-scales.  With --rounding sr and no --seed there are no bits to
    compare: exit 0 means consistent (every code a neighbour of its scaled
    value, fpsim's scales, away-roundings those of a stochastic rounding).
    """
    from fpsim.oracle import diff as run_diff
    from fpsim.oracle import load_arrays

    if reference is not None or tensor is not None:
        from .diff_checkpoint import run

        if reference is None or candidate is None or input_ref is not None:
            _fail("a checkpoint is compared as CANDIDATE --reference ORIGINAL [--tensor NAME] (no --input)", 2)
        run(candidate, reference, tensor, show, out_format)
        return
    sch = _build_scheme(scheme, scale_rule, block, tensor_scale, per_row_scale, four_over_six)
    smin = None if scale_min is None else _number(scale_min, "--scale-min")
    if input_ref is None:
        _fail("--input FILE[:NAME] is required", 2)
    raw = raw_codes is not None or raw_scales is not None
    if raw and candidate is not None:
        _fail("give CANDIDATE or --raw-codes/--raw-scales, not both", 2)
    if not raw and candidate is None:
        _fail("give CANDIDATE (.npz/.safetensors with codes, scales[, amax]) or --raw-codes and --raw-scales", 2)
    if raw and (raw_codes is None or raw_scales is None):
        _fail("--raw-codes and --raw-scales go together", 2)
    try:
        path, name = _split_ref(input_ref)
        x = _pick(load_arrays(path), name, path)
        if x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16":
            raise ValueError(f"{input_ref}: input must be real numbers, got dtype {x.dtype}")
        amax = None
        if raw:
            codes = _read_raw(raw_codes, np.uint8, "codes")
            if shape:
                try:
                    shp = tuple(int(s) for s in shape.replace("x", ",").split(",") if s.strip())
                except ValueError:
                    raise ValueError(f"--shape {shape!r}: use integers like 4,32") from None
                if not shp or min(shp) < 1:
                    raise ValueError(f"--shape {shape!r}: give positive integers like 4,32")
                if int(np.prod(shp)) != codes.size:
                    raise ValueError(f"--shape {shape} holds {int(np.prod(shp))} values; {raw_codes} has {codes.size}")
                codes = codes.reshape(shp)
            sdt = np.float32 if sch.scale is not None and sch.scale.bits == 32 else np.uint8
            scales = _read_raw(raw_scales, sdt, "scales")
        else:
            arrays = load_arrays(candidate)
            missing = [k for k in ("codes", "scales") if k not in arrays]
            if missing:
                raise ValueError(f"{candidate}: missing key(s) {', '.join(missing)} (has: "
                                 f"{', '.join(sorted(arrays)) or 'none'}; expected codes, scales[, amax]; a "
                                 "quantized checkpoint is given as CANDIDATE --reference ORIGINAL)")
            codes, scales, amax = arrays["codes"], arrays["scales"], arrays.get("amax")
        rep = run_diff(codes, scales, x, sch, axis=axis, candidate_amax=amax, packed=not unpacked,
                       swizzled=swizzled, show=show, nan_amax=nan_amax, scale_min=smin, rounding=rounding,
                       seed=seed, sr_bits=sr_bits, rht=rht)
    except (ValueError, TypeError) as e:  # the inputs or options: unusable (a DiagnosisError is neither)
        _fail(str(e).splitlines()[0], 2)
    except MemoryError:
        _fail("out of memory", 1)
    except Exception as e:  # fpsim's own bug: one line, exit 3, not a usage error
        _internal(e)
    try:
        text = None if out_format == "json" else rep.format_table()
        d = rep.to_dict() if out_format == "json" else None
    except Exception as e:
        _internal(e)
    _dump_json(d) if text is None else click.echo(text)
    click.get_current_context().exit(0 if rep.identical else 1)


@click.command()
@click.option("--scheme", default=None, help="Block scheme (nvfp4 (default), mxfp4, mxfp8_e4m3, …).")
@click.option("--element", default=None, help="Element-codec vectors of this format instead (e2m1, e4m3, …).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--dequantize-order", type=click.Choice(["fpsim", "te_cuda", "pts_s"]), default="fpsim",
              show_default=True, help="Two-level schemes: decoded = fl(fl(e·s)·S_dec) (fpsim), "
              "fl(e·fl(fl(s·amax)·fl(1/2688))) (Transformer Engine's CUDA) or fl(e·fl(pts·s)) (torchao's, ModelOpt's).")
@click.option("--convention", default=None, metavar="NAME",
              help="NVFP4: a producer's bytes and decoded values (torchao, compressed-tensors, modelopt, te-cuda, …; "
                   "docs/spec.md §4.1).")
@_scheme_options
def vectors(scheme, element, out_dir, dequantize_order, convention, scale_rule, block, tensor_scale, per_row_scale,
            four_over_six, nan_amax, scale_min) -> None:
    """Write golden test vectors (inputs, codes, scales, amax, decoded) of named edge cases.

    OUT/vectors.npz, OUT/bin/<case>.<field>.bin (raw little-endian) and
    OUT/manifest.json (dtype, shape, sha256 per file) — see docs/oracle.md.  With --element: every code
    decoded, and grid points, midpoints and their neighbours encoded under every rounding mode.
    Nothing is created when an option is refused.
    """
    from fpsim.io import OutputError
    from fpsim.oracle import write_vectors

    if out_dir == "":  # "" would write into the current directory
        _fail("--out '': give a directory", 2)
    if Path(out_dir).exists() and not Path(out_dir).is_dir():  # a device or FIFO (click refuses regular files)
        _fail(f"--out {out_dir}: not a directory", 2)
    if element is not None:
        given = [n for n, v in (("--scheme", scheme), ("--scale-rule", scale_rule), ("--block", block),
                                ("--scale-min", scale_min), ("--four-over-six", four_over_six),
                                ("--convention", convention)) if v is not None]
        given += [] if tensor_scale is None else ["--tensor-scale" if tensor_scale else "--no-tensor-scale"]
        given += ["--per-row-scale"] if per_row_scale else []
        given += [o for o, n in (("--nan-amax", "nan_amax"), ("--dequantize-order", "dequantize_order")) if _given(n)]
        if given:
            _fail(f"--element writes codec vectors: {', '.join(given)} do not apply", 2)
    sch = None
    if element is None:
        sch = _build_scheme(scheme or "nvfp4", scale_rule, block, tensor_scale, per_row_scale, four_over_six,
                            allow_all=True)
    smin = None if scale_min is None else _number(scale_min, "--scale-min")
    try:
        m = write_vectors(sch, out_dir, element=element, scale_rules="all" if scale_rule == "all" else None,
                          scale_min=smin, dequantize_order=dequantize_order, nan_amax=nan_amax,
                          convention=convention)
    except ValueError as e:
        _fail(str(e).splitlines()[0], 2)
    except OutputError as e:
        _fail(str(e), 1)
    except Exception as e:
        _internal(e)
    for c in m["cases"]:
        click.echo(f"{c['slug']:<48} {c['name']}")
    what = f"element format {m['element']}" if element is not None else sch.name
    click.echo(f"wrote {len(m['cases'])} cases of {what} to {out_dir} (manifest.json, vectors.npz, bin/)")
