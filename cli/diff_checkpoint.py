"""``fpsim diff CKPT --reference ORIGINAL [--tensor NAME]``: a producer's NVFP4 checkpoint against fpsim.

Every NVFP4 tensor :func:`fpsim.io.checkpoints.find_quantized` recognises in CKPT (compressed-tensors, ModelOpt,
torchao; a folder or a .safetensors file) is compared with fpsim's quantization of the original tensor of the
same name (bfloat16 as stored), its codes, block scales and stored global scale, by :func:`fpsim.oracle.diff`:
the producer conventions' parts name the cause of every differing byte (a fused layer's shared global scale
included), or say "not explained".  Exit 0 when every tensor is fpsim's byte for byte, 1 otherwise, 2 for bad
input (one line naming the file and tensor).
"""

from __future__ import annotations

import click


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    click.get_current_context().exit(2)


def _originals(reference: str) -> dict:
    from fpsim.io import open_tensors

    return {r.name: r for r in open_tensors([reference])}


def _groups(candidate: str, tensor: str | None) -> list:
    from fpsim.io import open_tensors
    from fpsim.io.checkpoints import find_quantized

    groups = [g for g in find_quantized(open_tensors([candidate]))[0] if g.fmt == "nvfp4"]
    if not groups:
        raise ValueError(f"{candidate}: no NVFP4 tensor of a compressed-tensors, ModelOpt or torchao checkpoint")
    if tensor is not None:
        keep = [g for g in groups if tensor in (g.name, g.name.removesuffix(".weight"))]
        if not keep:
            raise ValueError(f"{candidate}: no NVFP4 tensor {tensor!r} (has: "
                             f"{', '.join(g.name for g in groups[:8])}{', …' if len(groups) > 8 else ''})")
        groups = keep
    return groups


def _original(g, originals: dict, reference: str):
    ref = originals.get(g.name)
    if ref is None:
        raise ValueError(f"{reference}: no tensor {g.name!r} (the original of {g.directory}:{g.name})")
    x = ref.load()
    if x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16" or x.ndim != 2:
        raise ValueError(f"{reference}:{g.name}: need a 2-D floating-point tensor, got {x.dtype} {x.shape}")
    return x


def run(candidate: str, reference: str, tensor: str | None, show: int, out_format: str) -> None:
    """The command's body (called by ``fpsim diff`` when --reference is given)."""
    from fpsim.io import InputError, dumps
    from fpsim.io.checkpoints import read_codes
    from fpsim.oracle import diff

    results, identical = [], True
    try:
        originals = _originals(reference)
        groups = _groups(candidate, tensor)
        for g in groups:
            if g.error:
                raise ValueError(f"{g.directory}:{g.name}: {g.error}")
            codes, scale, glob_, _ = read_codes(g)
            x = _original(g, originals, reference)
            if codes.shape[0] != x.shape[0] or codes.shape[1] < x.shape[1]:
                raise ValueError(f"{g.directory}:{g.name}: codes {codes.shape} do not fit the original {x.shape}")
            rep = diff(codes[:, : x.shape[1]], scale, x, packed=False, show=show, candidate_global=glob_)
            identical &= rep.identical
            results.append((g, rep))
    except (ValueError, TypeError, InputError, OSError) as e:
        _fail(str(e).splitlines()[0])
    if out_format == "json":
        click.echo(dumps([{"tensor": g.name, "producer": g.producer, "directory": g.directory, **rep.to_dict()}
                          for g, rep in results]))
    else:
        for i, (g, rep) in enumerate(results):
            click.echo(("\n" if i else "") + f"== {g.name} ({g.producer}, {g.directory}) ==")
            click.echo(rep.format_table())
    click.get_current_context().exit(0 if identical else 1)

