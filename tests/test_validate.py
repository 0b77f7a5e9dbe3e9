"""fpsim.validate: each check accepts what the API documents and names the argument in everything else."""

import math

import numpy as np
import pytest

from fpsim.validate import COUNTER_LIMIT, MAX_BLOCK, amax_arg, axis_arg, block_arg, counter_arg, seed_arg


def test_axis():
    assert axis_arg(-1, 3) == 2 and axis_arg(np.int64(1), 2) == 1
    for bad, exc in ((0.7, TypeError), ("1", TypeError), (True, TypeError), (None, TypeError), (2, ValueError),
                     (-3, ValueError)):
        with pytest.raises(exc, match="axis"):
            axis_arg(bad, 2)


def test_counter():
    assert counter_arg(0) == 0 and counter_arg(COUNTER_LIMIT - 10, span=9) == COUNTER_LIMIT - 10
    for bad, exc in ((-1, ValueError), (2**64, ValueError), (COUNTER_LIMIT - 1, ValueError), (1.0, TypeError),
                     ("3", TypeError)):
        with pytest.raises(exc, match="counter"):
            counter_arg(bad, span=1)


def test_seed():
    assert seed_arg(None) is None and seed_arg(2**64 - 1) == 2**64 - 1
    for bad, exc in ((-1, ValueError), (2**64, ValueError), (1.5, TypeError)):
        with pytest.raises(exc, match="seed"):
            seed_arg(bad)


def test_amax():
    assert amax_arg(None) is None and amax_arg(np.float32(2.5)) == 2.5 and amax_arg(np.array(3.0)) == 3.0
    assert math.isnan(amax_arg(math.nan)) and amax_arg(math.inf) == math.inf and amax_arg(-0.0) == 0.0
    for bad, exc in ((-1, ValueError), (-math.inf, ValueError), ("1", TypeError), (True, TypeError),
                     (np.ones(2), TypeError)):
        with pytest.raises(exc, match="tensor_amax"):
            amax_arg(bad)


def test_block():
    assert block_arg(None) is None and block_arg([16, 16]) == (16, 16) and block_arg((1, MAX_BLOCK)) == (1, MAX_BLOCK)
    for bad, exc in (((1, 2**30), ValueError), ((0, 16), ValueError), ((1,), TypeError), ((1, 16.0), TypeError),
                     ("16", TypeError), (16, TypeError)):
        with pytest.raises(exc, match="block"):
            block_arg(bad)
