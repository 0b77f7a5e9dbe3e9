"""Which producer convention parts explain an NVFP4 candidate's bytes, stored global scale and decoded values.

:func:`fpsim.oracle.diff` runs this for NVFP4 (1×16 blocks, one per-tensor scale, round to nearest): the
hypotheses are the parts of every :data:`fpsim.conventions.CONVENTIONS` entry that differ from the reference
(global-scale formula and precision, block-scale formula, zero-block rules, clamps, encode multiplier, −0 and NaN
codes, which global scale is stored, decode order, +0 decode, bfloat16 values), plus a shared global scale (an amax
other than the tensor's own, read from the candidate's stored global scale).  The arithmetic is
:func:`fpsim.conventions.quantize_blocks` / :func:`~fpsim.conventions.decode_blocks` under the hypothesis; nothing
is re-implemented here.

Simpler explanations come first: the smallest set of parts that reproduces every differing byte (a single part
before a whole convention).  Each differing byte's cause is the set of the explanation's parts it needs (the parts
whose removal changes that byte back); a byte no part set reproduces is "not explained".  Values are compared
bitwise: a value whose code and block scale are the reference's but which still differs is a decode difference,
named by the decode parts that reproduce it (e.g. Transformer Engine's fl(e·fl(fl(s·amax)·fl(1/2688)))).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .. import conventions as C
from .._jit import get_num_threads, set_num_threads
from ..codecs import decode as np_decode

__all__ = ["Part", "ConventionDiff", "NOT_EXPLAINED", "parts_of", "diagnose", "applies"]

F32 = np.float32
NOT_EXPLAINED = "not explained"
_QKEYS = ("global_rule", "block_rule", "encode_rule", "zero_sdb", "scale_min", "zero_scale", "nan_scale",
          "neg_zero", "nan_code", "inf_nan_code")
_DKEYS = ("decode_rule", "decode_neg_zero", "decode_bf16")
_ENCODE_KIND = {C.GlobalRule.TE, C.GlobalRule.RECIP}  # g is an encode scale (≈ 2688/amax); PTS is a decode scale

#: What each part value means (the formulas of fpsim.conventions' enums).
_WHAT = {
    ("global_rule", C.GlobalRule.RECIP): "global scale G = fl(fl(1/amax)·2688) (bfloat16 ops for bfloat16 inputs)",
    ("global_rule", C.GlobalRule.PTS): "decode-side global scale pts = fl(amax/2688)",
    ("global_rule", C.GlobalRule.TE): "global scale S_enc = fl(2688/amax)",
    ("block_rule", C.BlockRule.MUL_G): "block scale fl(G·fl(vmax/6)) (vmax/6 in bfloat16 for bfloat16 inputs)",
    ("block_rule", C.BlockRule.DIV_PTS): "block scale fl(fl(vmax/6)/pts)",
    ("block_rule", C.BlockRule.DIV_6PTS): "block scale fl(vmax/fl(6·pts))",
    ("encode_rule", C.EncodeRule.TE_BF16): "bfloat16 encode coefficient bf16(fl(S_enc/s)) (fast math)",
    ("encode_rule", C.EncodeRule.DIV_S_G): "encode fl(x/fl(s/G))",
    ("encode_rule", C.EncodeRule.RECIP_PTS_S): "encode fl(x·fl(fl(1/pts)/s))",
    ("encode_rule", C.EncodeRule.DIV_S_PTS): "encode fl(x/fl(s·pts))",
    ("decode_rule", C.DecodeRule.TE_CUDA): "decode fl(e·fl(fl(s·amax)·fl(1/2688)))",
    ("decode_rule", C.DecodeRule.DIV_G): "decode fl(e·fl(s/G))",
    ("decode_rule", C.DecodeRule.S_PTS): "decode fl(e·fl(s·pts))",
    ("stored", C.Stored.ENCODE): "stores the encode scale G",
    ("stored", C.Stored.DECODE): "stores the decode scale pts = fl(amax/2688)",
    ("block_rule", C.BlockRule.TE): "block scale min(fl(vmax·fl(S_enc·fl(1/6))), 448)",
    ("encode_rule", C.EncodeRule.TE): "encode fl(x·min(fl(1/fl(s·S_dec)), FLT_MAX))",
    ("decode_rule", C.DecodeRule.FPSIM): "decode fl(fl(e·s)·S_dec)",
    ("stored", C.Stored.AMAX): "stores the tensor amax",
    ("zero_sdb", None): "a zero block's scale stays 0", ("scale_min", None): "block scales not clamped below",
    ("zero_scale", None): "a block scale that rounds to 0 stays 0",
    ("inf_nan_code", None): "a NaN from 0·inf gets the NaN element code",
    ("neg_zero", True): "−0 written as −0 (code 0x8)", ("decode_neg_zero", True): "code 0x8 decodes to −0",
    ("decode_bf16", False): "decoded values kept in float32",
}


def _what(k: str, v) -> str:
    if (k, v) in _WHAT and (v is not None or k != "amax"):
        return _WHAT[(k, v)]
    texts = {"zero_sdb": "a zero block's scale sdb = 0 becomes {v:g}", "scale_min": "block scales clamped to ≥ {v:g}",
             "zero_scale": "a block scale that rounds to 0 becomes {v:g}",
             "nan_scale": "a NaN block scale is written 0x{v:02X}", "neg_zero": "−0 written as +0 (code 0x0)",
             "nan_code": "a NaN element is written 0x{v:X}", "inf_nan_code": "a NaN from 0·inf is written 0x{v:X}",
             "decode_neg_zero": "code 0x8 decodes to +0", "decode_bf16": "decoded values rounded to bfloat16",
             "amax": "shared global scale: the stored global scale is that of amax {v!r}, not the tensor's own"}
    return texts.get(k, k + " = {v}").format(v=v)


#: The :data:`fpsim.oracle.CAUSES` category of each part's field (a part of three fields: "library conventions").
CATEGORY = {"global_rule": "global scale", "block_rule": "scale operation order", "encode_rule": "encode multiplier",
            "zero_sdb": "zero-block rule", "zero_scale": "zero-block rule", "scale_min": "scale clamp",
            "nan_scale": "NaN codes", "nan_code": "NaN codes", "inf_nan_code": "NaN codes", "neg_zero": "±0 sign",
            "stored": "stored global scale", "decode_rule": "decode order", "decode_neg_zero": "±0 sign",
            "decode_bf16": "decode rounding", "amax": "tensor amax"}


@dataclass(frozen=True)
class Part:
    """One part of a producer convention: the fields it sets (``values``), what it means, who does it."""

    values: tuple  #: ((field, value), ...) applied together
    what: str
    producers: tuple = ()

    @property
    def key(self) -> str:
        """A stable name: ``field=value`` joined by ``+``."""
        return "+".join(f"{k}={getattr(v, 'value', v)}" for k, v in self.values)

    @property
    def category(self) -> str:
        return "library conventions" if len(self.values) == 3 else CATEGORY[self.values[0][0]]

    def label(self) -> str:
        who = f" ({', '.join(self.producers)})" if self.producers else ""
        return f"{self.what}{who}"


def _v(v):
    return getattr(v, "value", v)


def parts_of(conv: C.Convention, base: C.Convention = C.FPSIM, decode: bool = False) -> list[Part]:
    """The parts in which ``conv`` differs from ``base``: its quantize parts (``decode=False``) or its decode parts.

    The global-scale, block-scale and encode formulas are one part when the global scale changes kind (an encode
    scale G ≈ 2688/amax or a decode scale pts = amax/2688): the block and encode formulas read it.  The decode
    formula of the encode scale G carries the producer's global-scale formula (its precision)."""
    cp, bp = conv.parts(), base.parts()
    out = []
    if decode:
        for k in _DKEYS:
            if cp[k] != bp[k]:
                vals = ((k, cp[k]),)
                if k == "decode_rule" and cp[k] is C.DecodeRule.DIV_G:
                    vals += (("global_rule", cp["global_rule"]),)
                out.append(Part(vals, _what(k, cp[k])))
        return out
    keys = [k for k in _QKEYS if cp[k] != bp[k]]
    trio = ("global_rule", "block_rule", "encode_rule")
    if (cp["global_rule"] in _ENCODE_KIND) != (bp["global_rule"] in _ENCODE_KIND):
        vals = tuple((k, cp[k]) for k in trio)
        out.append(Part(vals, "; ".join(_what(k, cp[k]) for k in trio if cp[k] != bp[k] or k == "global_rule")))
        keys = [k for k in keys if k not in trio]
    out += [Part(((k, cp[k]),), _what(k, cp[k])) for k in keys]
    return out


def _all_parts(base: C.Convention, decode: bool) -> dict[str, tuple[Part, list[str]]]:
    """Every distinct part over the conventions, with the conventions that have it."""
    seen: dict[str, tuple[Part, list[str]]] = {}
    for conv in C.CONVENTIONS.values():
        for p in parts_of(conv, base, decode):
            seen.setdefault(p.key, (p, []))[1].append(conv.name)
    return {k: (dataclasses.replace(p, producers=tuple(who)), who) for k, (p, who) in seen.items()}


def _apply(base: C.Convention, parts) -> tuple[C.Convention, float | None]:
    kw, amax = {}, None
    for p in parts:
        for k, v in p.values:
            if k == "amax":
                amax = v
            else:
                kw[k] = v
    return dataclasses.replace(base, **kw), amax


def applies(sch) -> bool:
    """Whether the producer conventions describe ``sch`` (NVFP4 as the producers write it)."""
    try:
        C.check_plan_parts(C.CONVENTIONS["torchao"], sch)
        return True
    except (ValueError, AttributeError):
        return False


def _same(a, b) -> np.ndarray:
    """Bitwise equality of float32 values, NaN equal to NaN (payload and sign are the host's)."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@dataclass
class ConventionDiff:
    """Causes of an NVFP4 candidate's differing bytes and values in producer-convention parts.

    ``code_causes`` / ``scale_causes`` / ``value_causes``: per differing element code, block scale and decoded value,
    the cause (parts' labels joined by " + ", or :data:`NOT_EXPLAINED`), as arrays of strings over the whole tensor
    ("" where nothing differs); ``global_cause`` for the stored global scale; ``explained_by``: the smallest part
    sets that reproduce every differing byte (labels), ``convention``: the producer whose parts those are all of
    (None if none)."""

    reference: str
    code_causes: np.ndarray
    scale_causes: np.ndarray
    value_causes: np.ndarray | None = None
    global_cause: str = ""
    global_ours: float | None = None
    global_candidate: float | None = None
    explained_by: list = field(default_factory=list)
    decoded_by: list = field(default_factory=list)
    convention: list = field(default_factory=list)
    keys: dict = field(default_factory=dict)  #: label → part key
    global_key: str = ""  #: the stored global scale's cause as a part key (or :data:`NOT_EXPLAINED`)
    cats: dict = field(default_factory=dict)  #: label → :data:`fpsim.oracle.CAUSES` category

    def category(self, cause: str) -> str:
        """The :data:`fpsim.oracle.CAUSES` category of a cause string (its parts' categories)."""
        if not cause or cause == NOT_EXPLAINED:
            return cause
        alts = []
        for alt in cause.split(" or "):
            cats = list(dict.fromkeys(self.cats.get(lab, "other") for lab in alt.split(" + ")))
            alts.append(" + ".join(cats))
        return " or ".join(dict.fromkeys(alts))

    def counts(self) -> dict:
        """{"codes"|"scales"|"values"|"global": {cause: count}}."""
        out = {}
        for what, a in (("codes", self.code_causes), ("scales", self.scale_causes), ("values", self.value_causes)):
            if a is not None:
                out[what] = dict(Counter(a[a != ""].tolist()))
        if self.global_cause:
            out["global"] = {self.global_cause: 1}
        return out

    @property
    def n_differing(self) -> int:
        return sum(sum(v.values()) for v in self.counts().values())

    @property
    def n_not_explained(self) -> int:
        return sum(v.get(NOT_EXPLAINED, 0) for v in self.counts().values())

    def to_dict(self) -> dict:
        return {"reference": self.reference, "explained_by": self.explained_by, "decoded_by": self.decoded_by,
                "convention": self.convention, "causes": self.counts(),
                "global": {"ours": self.global_ours, "candidate": self.global_candidate,
                           "cause": self.global_cause or None}}

    def lines(self) -> list[str]:
        """The diagnosis in a few lines (for :meth:`fpsim.oracle.DiffReport.format_table`); none where no part
        explains a byte and neither values nor a global scale were compared."""
        if not (self.explained_by or self.decoded_by or self.global_cause or self.value_causes is not None):
            return []
        out = []
        if self.convention:
            out.append(f"producer convention: every differing byte and value is {' or '.join(self.convention)}'s "
                       f"(against {self.reference})")
        if self.explained_by:
            out.append("producer parts that explain every differing byte: " + " | ".join(self.explained_by[0]))
            for alt in self.explained_by[1:3]:
                out.append("  or equally: " + " | ".join(alt))
        if self.decoded_by:
            out.append("decode parts that explain every differing value: " + " | ".join(self.decoded_by[0]))
        for what, c in self.counts().items():
            if not c:
                continue
            out.append(f"{what} differing by cause: "
                       + "; ".join(f"{k} ×{n}" for k, n in sorted(c.items(), key=lambda kv: -kv[1])))
        return out


def _cause(need: list[Part]) -> str:
    return " + ".join(p.label() for p in need) if need else NOT_EXPLAINED


class _Bytes:
    """Quantize hypotheses over the blocks that matter, cached by their part keys."""

    def __init__(self, X3, bf16, base, amax):
        self.X3, self.bf16, self.base, self.amax = X3, bf16, base, amax
        self.cache = {}

    def run(self, parts) -> tuple[np.ndarray, np.ndarray]:
        key = frozenset(p.key for p in parts)
        if key not in self.cache:
            conv, a = _apply(self.base, parts)
            with np.errstate(all="ignore"):
                c, s, _ = C.quantize_blocks(self.X3, conv, self.bf16, amax=self.amax if a is None else a)
            self.cache[key] = (np.asarray(c, np.uint8), np.asarray(s, np.uint8))
        return self.cache[key]


_NEEDS = {C.DecodeRule.FPSIM: C.Stored.AMAX, C.DecodeRule.TE_CUDA: C.Stored.AMAX,
          C.DecodeRule.DIV_G: C.Stored.ENCODE, C.DecodeRule.S_PTS: C.Stored.DECODE}


def _candidates(parts: dict, base: C.Convention, decode: bool) -> list[list[Part]]:
    """The part sets tried, smallest first: each part alone, any two parts, then every subset of each producer's
    parts (with the shared-amax part, if any, added to each)."""
    extra = [p for p in parts.values() if p.values[0][0] == "amax"]
    own = [[parts[p.key] for p in parts_of(conv, base, decode)] for conv in C.CONVENTIONS.values()]
    out, seen = [], set()

    def add(combo):
        keys = [k for p in combo for k, _ in p.values]
        key = frozenset(p.key for p in combo)
        if combo and len(keys) == len(set(keys)) and key not in seen:
            seen.add(key)
            out.append(list(combo))

    for size in (1, 2):
        for combo in itertools.combinations(parts.values(), size):
            add(combo)
    for ps in own:
        for size in range(1, len(ps) + 1):
            for combo in itertools.combinations(ps, size):
                add(combo)
                for e in extra:
                    add(combo + (e,))
    return sorted(out, key=len)


def _explain(run, targets, candidates: list[list[Part]]) -> list[list[Part]]:
    """The smallest of ``candidates`` (part sets) whose outputs ``run(parts)`` equal ``targets`` everywhere."""
    best = []
    for parts in candidates:
        if best and len(parts) > len(best[0]):
            break
        if all(o.shape == t.shape and bool(np.all(_same(o, t) if o.dtype.kind == 'f' else o == t))
               for o, t in zip(run(parts), targets)):
            best.append(parts)
    return best


def _minimal(eqs_of, parts: list[Part], bads: list[np.ndarray]) -> list[np.ndarray]:
    """Per target, the cause of each ``bads`` element: the smallest subsets of ``parts`` that reproduce it
    (``eqs_of(subset)`` → one mask per target: equal to the candidate); several of one size are alternatives."""
    outs = [np.full(b.shape, "", object) for b in bads]
    left = [b.reshape(-1).copy() for b in bads]
    for k in range(1, len(parts) + 1):
        if not any(x.any() for x in left):
            break
        combos = list(itertools.combinations(parts, k))
        idx = [np.flatnonzero(x) for x in left]
        m = [np.zeros((len(combos), i.size), bool) for i in idx]
        for j, combo in enumerate(combos):
            for i, eq in enumerate(eqs_of(list(combo))):
                m[i][j] = np.broadcast_to(eq, bads[i].shape).reshape(-1)[idx[i]]
        for i in range(len(bads)):
            hit = m[i].any(axis=0)
            if not hit.any():
                continue
            rows, inv = np.unique(m[i][:, hit].T, axis=0, return_inverse=True)
            names = np.array([" or ".join(_cause(list(combos[j])) for j in np.flatnonzero(r)) for r in rows], object)
            outs[i].reshape(-1)[idx[i][hit]] = names[inv.reshape(-1)]
            left[i][idx[i][hit]] = False
    for o, x in zip(outs, left):
        o.reshape(-1)[x] = NOT_EXPLAINED
    return outs


def _join(a: str, b: str) -> str:
    """Causes a and b together (each possibly alternatives joined by " or ")."""
    if not a or not b:
        return a or b
    if NOT_EXPLAINED in (a, b):
        return NOT_EXPLAINED
    return " or ".join(f"{x} + {y}" for x in a.split(" or ") for y in b.split(" or "))


def _implied_amax(g: F32, amax: F32, bf16: bool) -> list[tuple[float, str]]:
    """Tensor amaxes (not ``amax``) whose stored global scale, under some convention, is ``g``."""
    out = []
    if not np.isfinite(g) or g <= 0:
        return out
    guesses = {C.Stored.AMAX: g, C.Stored.DECODE: F32(g * F32(2688.0)), C.Stored.ENCODE: F32(F32(2688.0) / g)}
    for conv in C.CONVENTIONS.values():
        a0 = guesses[conv.stored]
        if not np.isfinite(a0) or a0 <= 0:
            continue
        span = 1 << 17 if (bf16 and conv.stored is C.Stored.ENCODE) else 16
        bits = np.arange(int(a0.view(np.uint32)) - span, int(a0.view(np.uint32)) + span + 1, dtype=np.int64)
        cand = bits[(bits > 0) & (bits < 0x7F800000)].astype(np.uint32).view(F32)
        with np.errstate(all="ignore"):
            sv = np.asarray(C.stored_value(cand, conv, bf16), F32)
        hit = cand[_same(sv, np.full_like(sv, g))]
        if conv.stored is C.Stored.ENCODE:  # prefer an amax whose own S_enc = fl(2688/amax) is g: fpsim's decode of
            # the candidate's bytes then reads the global scale the candidate stores
            with np.errstate(all="ignore"):
                own = hit[_same(C.global_scale(hit, C.FPSIM, False), np.full_like(hit, g))]
            hit = own if own.size else hit
        if hit.size:
            a = hit[np.argmin(np.abs(hit.astype(np.float64) - float(a0)))]
            if a != amax and all(float(a) != o for o, _ in out):
                out.append((float(a), conv.name))
    return out


def _stored(candidate_global, amax, base: C.Convention, bf16: bool, qparts: dict):
    """The stored global scale: (cause label, key, ours, shared-amax readings, conventions storing exactly it, the
    parts named).  A global scale that no convention stores for this amax is read as a shared one (another amax):
    one part per reading is added to ``qparts``, and the bytes choose between them."""
    g_cause, g_key, g_ours, shared, stored_kinds, named = "", "", None, [], [], []
    if candidate_global is None:
        return g_cause, g_key, g_ours, shared, stored_kinds, named
    g = F32(np.asarray(candidate_global, F32).reshape(-1)[0])
    with np.errstate(all="ignore"):
        g_ours = F32(C.stored_value(amax, base, bf16))
        stored_kinds = [c for c in C.CONVENTIONS.values() if _same(C.stored_value(amax, c, bf16), g)]
    if _same(g, g_ours):
        return g_cause, g_key, g_ours, shared, stored_kinds, named
    kinds = [c for c in stored_kinds if c.stored is not base.stored]
    if len({c.stored for c in kinds}) > 1:  # e.g. amax = 2688: G = pts = 1
        return NOT_EXPLAINED, NOT_EXPLAINED, g_ours, shared, stored_kinds, named
    if kinds:
        c0 = kinds[0]
        gp = Part((("stored", c0.stored),), _what("stored", c0.stored),
                  tuple(sorted({c.name for c in kinds if c.stored is c0.stored})))
        return gp.label(), gp.key, g_ours, shared, stored_kinds, [gp]
    shared = _implied_amax(g, amax, bf16)
    for a, who in shared:
        kind = C.CONVENTIONS[who].stored
        sp = Part((("amax", a), ("stored", kind)), _what("amax", a) + f" ({_what('stored', kind)})")
        qparts[sp.key] = sp
        named.append(sp)
    return NOT_EXPLAINED, NOT_EXPLAINED, g_ours, shared, stored_kinds, named


def _agreed(per: list, i: int, arr: np.ndarray, bad: np.ndarray) -> None:
    """Write the causes the explanations agree on into ``arr``; where they disagree, :data:`NOT_EXPLAINED`."""
    vals = [p[i] for p in per]
    agree = np.all([v == vals[0] for v in vals], axis=0)
    arr[bad & agree] = vals[0][bad & agree]
    arr[bad & ~agree] = NOT_EXPLAINED


def _byte_causes(eng: _Bytes, cand_c, cand_s, valid, qparts: dict):
    """(code causes, scale causes, causes of each element's code and scale together, the explanations)."""
    ours_c, ours_s = eng.run([])
    bad_c, bad_s = (ours_c != cand_c) & valid, ours_s != cand_s
    both = bad_c | bad_s[..., None]
    out = [np.full(bad_c.shape, "", object), np.full(bad_s.shape, "", object), np.full(bad_c.shape, "", object)]
    if not (bad_c.any() or bad_s.any()):
        return (*out, [])
    # the hypotheses see only the blocks holding a difference (blocks are independent given the amax); an
    # explanation is then checked to change nothing elsewhere
    hot = bad_s | bad_c.any(axis=-1)
    sub = _Bytes(eng.X3[hot][None], eng.bf16, eng.base, eng.amax)
    tc, ts, vh = cand_c[hot][None], cand_s[hot][None], valid[hot][None]
    found = _explain(lambda p: (np.where(vh, sub.run(p)[0], tc), sub.run(p)[1]), (tc, ts),
                     _candidates(qparts, eng.base, False))
    explained = [e for e in found if np.array_equal(np.where(valid, eng.run(e)[0], cand_c), cand_c)
                 and np.array_equal(eng.run(e)[1], cand_s)]
    if not explained:
        for arr, bad in zip(out, (bad_c, bad_s, both)):
            arr[bad] = NOT_EXPLAINED
        return (*out, [])

    def eqs(parts):
        c, s_ = eng.run(parts)
        ec, es = (c == cand_c) | ~valid, s_ == cand_s
        return ec, es, ec & es[..., None]

    per = [_minimal(eqs, e, [bad_c, bad_s, both]) for e in explained]
    for i, (arr, bad) in enumerate(zip(out, (bad_c, bad_s, both))):
        _agreed(per, i, arr, bad)
    return (*out, explained)


def _value_causes(dec, ours_v, cv, valid, joint, both, dparts: dict, base: C.Convention, kinds: set):
    """(value causes, the decode explanations): a differing value's cause is its bytes' (``joint``) and the decode
    parts that reproduce it from the candidate's own bytes (``dec(parts)``: decoded values)."""
    bad_v = ~_same(ours_v, cv) & valid
    value_causes = np.full(bad_v.shape, "", object)
    if not bad_v.any():
        return value_causes, []
    needs = bad_v & ~_same(dec([]), cv)
    found = []
    if needs.any():  # a decoder reads the global scale its producer stores: only rules reading that kind are tried
        cands = [ps for ps in _candidates(dparts, base, True)
                 if not kinds or _NEEDS[_apply(base, ps)[0].decode_rule] in kinds]
        found = _explain(lambda p: (np.where(valid, dec(p), cv),), (cv,), cands)
    dcause = np.full(bad_v.shape, "", object)
    if found:
        per = [_minimal(lambda p: (_same(dec(p), cv) | ~valid,), f, [needs]) for f in found]
        _agreed(per, 0, dcause, needs)
    else:
        dcause[needs] = NOT_EXPLAINED
    for m in zip(*np.nonzero(bad_v)):
        value_causes[m] = _join((joint[m] or NOT_EXPLAINED) if both[m] else "",
                                (dcause[m] or NOT_EXPLAINED) if needs[m] else "")
    return value_causes, found


def diagnose(x32: np.ndarray, codes: np.ndarray, scales: np.ndarray, *, bf16: bool = False,
             reference: str = "fpsim", candidate_global=None, candidate_values=None) -> ConventionDiff:
    """Name the producer-convention parts behind every byte, stored global scale and value that differ from
    ``reference``'s NVFP4 quantization of ``x32`` ([R, C] float32; ``bf16``: the input was bfloat16).

    ``codes``: the candidate's E2M1 codes [R, C] (one per byte); ``scales``: its E4M3 bytes [R, C/16];
    ``candidate_global``: the FP32 global scale it stores (amax, G or pts); ``candidate_values``: its decoded values
    [R, C] (float32).  Returns a :class:`ConventionDiff`.

    Hundreds of quantizations run here: on tensors below 2^20 elements the parallel kernels run on one thread
    meanwhile (a thread pool's start-up per call costs more than the work, and much more on a busy machine)."""
    threads = get_num_threads()
    if np.size(x32) < 1 << 20:
        set_num_threads(1)
    try:
        return _diagnose(x32, codes, scales, bf16, C.get_convention(reference), candidate_global, candidate_values)
    finally:
        set_num_threads(threads)


def _diagnose(x32, codes, scales, bf16: bool, base: C.Convention, candidate_global, candidate_values):
    R, Cn = x32.shape
    nb = scales.shape[1]

    def blocks(a, dtype):
        out = np.zeros((R, nb * 16), dtype)
        out[:, :Cn] = a
        return out.reshape(R, nb, 16)

    X3, cand_c, valid = blocks(x32, F32), blocks(codes, np.uint8), blocks(True, bool)
    cand_s = np.asarray(scales, np.uint8)
    with np.errstate(all="ignore"):
        amax = F32(np.nan) if np.isnan(x32).any() else F32(np.max(np.abs(x32))) if x32.size else F32(0)
    qparts = {k: p for k, (p, _) in _all_parts(base, False).items()}
    dparts = {k: p for k, (p, _) in _all_parts(base, True).items()}
    g_cause, g_key, g_ours, shared, stored_kinds, gparts = _stored(candidate_global, amax, base, bf16, qparts)
    eng = _Bytes(X3, bf16, base, amax)
    code_causes, scale_causes, joint, explained = _byte_causes(eng, cand_c, cand_s, valid, qparts)
    kinds = {c.stored for c in stored_kinds}
    a_dec = amax
    if shared:  # the reading of the stored global scale that every byte explanation uses, if one
        used = {p.key: p for e in explained for p in e if p.values[0][0] == "amax"}
        if len(used) == 1 and all(any(p.values[0][0] == "amax" for p in e) for e in explained):
            sp = next(iter(used.values()))
            g_cause, g_key, a_dec = sp.label(), sp.key, F32(sp.values[0][1])
            kinds.add(sp.values[1][1])
    value_causes, found = None, []
    if candidate_values is not None:
        ours_c, ours_s = eng.run([])
        cand_g = None if candidate_global is None else F32(np.asarray(candidate_global, F32).reshape(-1)[0])

        e_c, s_c = np_decode(cand_c, "float4_e2m1fn"), np_decode(cand_s, "float8_e4m3fn")[..., None]

        def dec(parts, e=None, s=None):
            e, s = (e_c, s_c) if e is None else (e, s)
            conv, _ = _apply(base, parts)
            with np.errstate(all="ignore"):
                gin = cand_g if cand_g is not None and _NEEDS[conv.decode_rule] in kinds else \
                    C.decode_input(a_dec, conv, bf16)
                return np.asarray(C.decode_blocks(e, s, gin, conv), F32)

        ours_v = dec([], np_decode(ours_c, "float4_e2m1fn"), np_decode(ours_s, "float8_e4m3fn")[..., None])
        value_causes, found = _value_causes(dec, ours_v, blocks(np.asarray(candidate_values, F32).reshape(R, Cn), F32),
                                            valid, joint, (code_causes != "") | (scale_causes != "")[..., None],
                                            dparts, base, kinds)
    named = [p for e in explained + found for p in e]
    used = {p.key for p in named}
    convs = [conv.name for conv in C.CONVENTIONS.values() if used and used <= {
        p.key for p in parts_of(conv, base) + parts_of(conv, base, True)}]
    every = list(qparts.values()) + list(dparts.values()) + gparts + named
    return ConventionDiff(
        reference=base.name, code_causes=code_causes[valid].reshape(R, Cn),
        scale_causes=scale_causes, value_causes=None if value_causes is None else value_causes[valid].reshape(R, Cn),
        global_cause=g_cause, global_ours=None if g_ours is None else float(g_ours),
        global_candidate=None if candidate_global is None else float(np.asarray(candidate_global,
                                                                                F32).reshape(-1)[0]),
        explained_by=[[p.label() for p in e] for e in explained], decoded_by=[[p.label() for p in f] for f in found],
        convention=convs, keys={p.label(): p.key for p in named}, global_key=g_key,
        cats={p.label(): p.category for p in every})
