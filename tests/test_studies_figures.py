"""Report figures are deterministic (issue 16 item 13): last-bit differences in the data draw the same bytes."""

import numpy as np

from studies.common import save_fig


def _figure(path, y, heights):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    n = np.arange(1, y.size + 1)
    axes[0].loglog(n, y, "o-", label="curve")
    axes[0].legend()
    axes[1].bar(np.arange(heights.size), heights, yerr=heights / 10)
    axes[1].set_title("bias (% of mean|x|)")
    save_fig(fig, path)
    return path.read_bytes()


def test_figures_do_not_depend_on_the_last_bits_of_the_data(tmp_path):
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.random(300)) * 1e-3
    h = rng.random(6)
    ulp = np.nextafter(y, np.inf)  # what another CPU's SIMD sum or BLAS may give
    a = _figure(tmp_path / "a.png", y, h)
    b = _figure(tmp_path / "b.png", ulp, np.nextafter(h, -np.inf))
    c = _figure(tmp_path / "c.png", y, h)
    assert a == c, "the same figure twice gives different bytes"
    assert a == b, "a last-bit change in the data changes the figure's bytes"
    assert b"Software" not in a and b"Creation" not in a  # no version or date metadata


def test_figures_use_only_matplotlibs_bundled_fonts():
    import matplotlib
    import matplotlib.font_manager as fm

    import studies.common  # noqa: F401  (configures matplotlib)

    bundled = matplotlib.get_data_path()
    assert fm.fontManager.ttflist and all(f.fname.startswith(bundled) for f in fm.fontManager.ttflist)
    assert fm.findfont(fm.FontProperties(family=["sans-serif"])).startswith(bundled)
    assert matplotlib.rcParams["font.family"] == ["DejaVu Sans"]
