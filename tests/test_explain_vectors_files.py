"""``fpsim explain`` (a decimal value rounded to float32 once, errors naming the right operand, block options
refused where they do nothing), ``fpsim vectors`` with per-row scales, and QuantizedTensor files (every flag kept,
hand-edited metadata one clear error), each checked against the spec or docs/oracle.md, not against fpsim."""

import io
import json
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.io.quantized import load_quantized, save_quantized
from fpsim.oracle import read_vectors
from fpsim_cli.main import main
from tests.cliutil import strict_json


def _explain(*args):
    r = CliRunner().invoke(main, ["explain", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def _f32_rne(q: Fraction) -> int:
    """Bits of the float32 nearest to the exact positive rational ``q`` (ties to even), by hand: independent of
    numpy's and Python's float parsing."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    e = max(e, -126)  # subnormals share the spacing of the smallest binade
    m = q / Fraction(2) ** (e - 23)  # the significand in units of the last place
    n, rem = divmod(m.numerator, m.denominator)
    if 2 * rem > m.denominator or (2 * rem == m.denominator and n % 2):
        n += 1
    v = Fraction(n) * Fraction(2) ** (e - 23)
    return int(np.float32(float(v)).view(np.uint32))  # v is a float32 value: both conversions are exact


def test_explain_decimal_value_is_rounded_to_float32_once():
    """docs/oracle.md: inputs are converted to float32 (RNE).  Parsing the decimal to float64 first rounds twice:
    1 + 2^-24 + 10^-30 lands on the float32 midpoint 1 + 2^-24 and then tied to even 1.0 (0x3F800000); the
    nearest float32 is 1 + 2^-23 (0x3F800001)."""
    r = _explain("1.000000059604644775390625000001", "--format", "bf16", "--json")
    assert r.exit_code == 0, r.output
    assert strict_json(r.output)["input"]["hex"] == "0x3F800001"
    # every float32 midpoint nudged by ±10^-40 relative, and exact: the CLI agrees with exact rounding
    rng = np.random.default_rng(5)
    bits = np.concatenate([rng.integers(1, 0x7F7FFFFF, 40), [1, 0x7FFFFE, 0x7F7FFFFE]]).astype(np.uint32)
    from fpsim_cli.oracle_cmds import _parse_value

    for b in bits:
        lo = Fraction(float(np.uint32(b).view(np.float32)))
        hi = Fraction(float(np.uint32(b + 1).view(np.float32)))
        mid = (lo + hi) / 2
        for q in (mid, mid * (1 + Fraction(1, 10**40)), mid * (1 - Fraction(1, 10**40))):
            text = f"{q.numerator * 10**200 // q.denominator}e-200"  # a decimal within 10^-200 of q
            exact = Fraction(q.numerator * 10**200 // q.denominator, 10**200)
            got = int(_parse_value(text).view(np.uint32))
            assert got == _f32_rne(exact), (text[:40], hex(got), hex(_f32_rne(exact)))


def test_explain_unreadable_value_names_the_value_not_the_scale():
    r = _explain("abc", "--format", "e2m1", "--scale", "2")
    assert r.exit_code == 2
    assert "'abc'" in r.output and "'2'" not in r.output, r.output
    r = _explain("2", "--format", "e2m1", "--scale", "xyz")
    assert r.exit_code == 2 and "'xyz'" in r.output, r.output


def test_explain_block_with_a_scheme_without_blocks_is_a_usage_error(tmp_path):
    """docs/oracle.md: explain exits 1 when the input file cannot be used and 2 on usage (a bad option); a scheme
    --block cannot explain is an option refusal, whatever the file."""
    p = tmp_path / "x.npz"
    np.savez(p, x=np.arange(64, dtype=np.float32).reshape(2, 32))
    for scheme in ("fp8_e4m3", "bf16"):
        r = _explain("--block", f"{p}:x:0", "--scheme", scheme)
        assert r.exit_code == 2, (scheme, r.exit_code, r.output)
        assert "1-D blocks" in r.output
    assert _explain("--block", f"{p}:x:0", "--scheme", "nvfp4").exit_code == 0


def test_vectors_with_per_row_scale_round_trip(tmp_path):
    """docs/oracle.md: the scheme options of ``fpsim diff`` apply to ``fpsim vectors``; --per-row-scale failed on the
    2-D 16x16-tile case (per-row scales are undefined for tiles).  The written files equal fpsim.quantize."""
    r = CliRunner().invoke(main, ["vectors", "--scheme", "nvfp4", "--per-row-scale", "--out", str(tmp_path / "v")])
    assert r.exit_code == 0, r.output
    manifest, cases = read_vectors(tmp_path / "v")
    sch = fpsim.get_scheme("nvfp4").replace(per_row_scale=True)
    assert manifest["scheme"]["per_row_scale"] is True and len(cases) > 10
    for c in manifest["cases"]:
        a = cases[c["name"]]
        q = fpsim.quantize(a["input"], sch, **c["kwargs"])
        assert np.array_equal(a["packed"], q.data) and np.array_equal(a["scales"], q.scales), c["name"]
        assert a["decoded"].tobytes() == q.dequantize().tobytes(), c["name"]
        lo, hi = a["packed"] & 0xF, a["packed"] >> 4  # element 2j in the low nibble
        assert np.array_equal(np.stack([lo, hi], -1).reshape(a["codes"].shape), a["codes"])


def _npz_with_meta(path, q, edit):
    meta = json.loads(fpsim.io.quantized._meta(q))
    edit(meta)
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), data=q.data, scales=q.scales,
             amax=np.asarray(q.amax, np.float32))
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(shape=[]), "scalar"),  # was "tuple index out of range"
    (lambda m: m["scheme"].update(tensor_scale="false"), "tensor_scale"),  # was loaded as tensor_scale=True
    (lambda m: m["scheme"].update(four_over_six="no"), "four_over_six"),
    (lambda m: m["scheme"].update(block=[1.5, 16]), "block"),  # was int(1.5) = 1
    (lambda m: m["scheme"].update(block=[True, 16]), "block"),
])
def test_hand_edited_quantized_metadata_is_one_clear_error(tmp_path, edit, words):
    q = fpsim.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "nvfp4")
    p = _npz_with_meta(tmp_path / "q.npz", q, edit)
    with pytest.raises(ValueError) as e:
        load_quantized(p)
    msg = str(e.value)
    assert str(p) in msg and words in msg and "\n" not in msg, msg


def test_quantized_round_trip_keeps_every_flag(tmp_path):
    """The type checks refuse nothing fpsim writes (flags, 2-D tiles, per-row scales, casts)."""
    x = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32)
    nv = fpsim.get_scheme("nvfp4")
    for sch in (nv, nv.replace(per_row_scale=True), nv.replace(block=(16, 16)), nv.replace(tensor_scale=False),
                nv.replace(four_over_six=True, four_over_six_metric="mae"), "mxfp4", "fp8_e4m3", "bf16"):
        q = fpsim.quantize(x, sch, axis=0)
        for ext in ("npz", "safetensors"):
            save_quantized(q, tmp_path / f"q.{ext}")
            assert load_quantized(tmp_path / f"q.{ext}").equals(q)
