"""Coverage-guided fuzzing of one reader with atheris (libFuzzer): ``python -m tests.fuzz.fuzz READER [libFuzzer
arguments] [CORPUS_DIR ...]``, READER one of :data:`tests.fuzz.harnesses.READERS`.

fpsim's modules (and gguf's, for the GGUF reader) are instrumented for coverage, except the Numba-compiled kernels
(instrumented bytecode would not compile); numpy and torch are not.  A finding is any exception but the reader's
documented one-line error, a run past libFuzzer's ``-timeout`` (a hang) or past ``-rss_limit_mb``; libFuzzer writes
the input to ``-artifact_prefix`` and exits non-zero.

With ``FPSIM_FUZZ_STATS=FILE`` the slowest input so far (seconds, size, SHA-1) and the number of inputs executed are
written to FILE as JSON when the slowest changes and every 20000 inputs, and the slowest input itself to FILE.slowest:
libFuzzer reports its slowest unit in whole seconds only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

#: fpsim modules holding Numba-compiled functions: not instrumented.
_NUMBA_MODULES = ["fpsim._analysis_kernels", "fpsim._cache", "fpsim._jit", "fpsim._kernels", "fpsim._row_kernels",
                  "fpsim._scaling_kernels", "fpsim._simd", "fpsim.backends", "fpsim.conventions", "fpsim.gemm",
                  "fpsim.transforms", "fpsim.oracle.producers", "fpsim.torch.conventions"]


def _stats_writer(target):
    path = os.environ.get("FPSIM_FUZZ_STATS")
    if not path:
        return target
    state = {"execs": 0, "slowest_s": 0.0, "slowest_bytes": 0, "slowest_sha1": None}

    def dump():
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)

    def timed(data: bytes) -> None:
        t0 = time.perf_counter()
        try:
            target(data)
        finally:
            dt = time.perf_counter() - t0
            state["execs"] += 1
            if dt > state["slowest_s"]:
                state.update(slowest_s=dt, slowest_bytes=len(data), slowest_sha1=hashlib.sha1(data).hexdigest())
                with open(path + ".slowest", "wb") as f:
                    f.write(data)
                dump()
            elif state["execs"] % 20000 == 0:
                dump()

    return timed


def _warm_up(target, dirs: list[str]) -> None:
    """Run the target once on each seed before fuzzing: imports (torch) and Numba's compiles (from its cache or
    fresh) happen here, not inside libFuzzer's time bound of the first inputs.  A seed's exception is left for
    libFuzzer to report."""
    from pathlib import Path

    for d in dirs:
        for f in sorted(Path(d).glob("*")) if Path(d).is_dir() else []:
            try:
                target(f.read_bytes())
            except Exception:  # noqa: BLE001, S110 - the fuzzer's own run of this seed reports it
                pass


def main(argv: list[str]) -> None:
    import atheris

    if len(argv) < 2:
        sys.exit("usage: python -m tests.fuzz.fuzz READER [libFuzzer arguments] [CORPUS_DIR ...]")
    reader = argv[1]
    with atheris.instrument_imports(include=["fpsim", "gguf"], exclude=_NUMBA_MODULES):
        import fpsim  # noqa: F401
        import fpsim.io.checkpoint_check  # noqa: F401
        import fpsim.io.checkpoints  # noqa: F401
        import fpsim.ranking  # noqa: F401
        if reader == "gguf":
            import gguf  # noqa: F401

            import fpsim.torch.model_files  # noqa: F401
    from tests.fuzz.harnesses import READERS

    if reader not in READERS:
        sys.exit(f"unknown reader {reader!r}; readers: {', '.join(READERS)}")
    import warnings

    warnings.simplefilter("ignore")  # a warning is not a finding (the test suite's filter makes them errors)
    _warm_up(READERS[reader], [a for a in argv[2:] if not a.startswith("-")])
    atheris.Setup([argv[0], *argv[2:]], _stats_writer(READERS[reader]))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
