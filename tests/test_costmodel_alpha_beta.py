"""clusterlab.analytic.costmodel.alpha_beta: the held-out fit, a collective's alpha-beta line, crossovers."""

import math

import numpy as np
import pytest

from clusterlab.analytic import costmodel


def _line(sizes, alpha=1e-4, beta=1e-9):
    return alpha + beta * np.asarray(sizes, dtype=float)


def test_fit_held_out_recovers_an_exact_line_and_predicts_it():
    sizes = 2.0 ** np.arange(12, 24)
    result = costmodel.fit_held_out(sizes, _line(sizes), np.arange(sizes.size) % 2 == 1)
    assert result.model.alpha == pytest.approx(1e-4, rel=1e-9)
    assert result.model.beta == pytest.approx(1e-9, rel=1e-9)
    np.testing.assert_allclose(result.held_out_bytes, sizes[1::2])
    assert result.max_abs_error < 1e-9


def test_fit_held_out_reports_the_error_of_a_point_off_the_line():
    sizes = 2.0 ** np.arange(12, 20)
    times = _line(sizes)
    times[-1] *= 1.25  # the largest size is 25% slower than the line
    result = costmodel.fit_held_out(sizes, times, [sizes.size - 1])  # indices work too
    # predicted = measured / 1.25, so the relative error is 1/1.25 - 1 = -0.2
    np.testing.assert_allclose(result.relative_errors, [-0.2], rtol=1e-9)
    assert result.median_abs_error == pytest.approx(0.2, rel=1e-9)
    assert result.max_abs_error == pytest.approx(0.2, rel=1e-9)


def test_fit_held_out_uses_only_the_sizes_it_keeps():
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    times = _line(sizes)
    times[1] = 1.0  # wildly off, but held out: the fit must not see it
    result = costmodel.fit_held_out(sizes, times, np.array([False, True, False, False]))
    assert result.model.beta == pytest.approx(1e-9, rel=1e-9)
    assert result.predicted_s[0] == pytest.approx(_line(1e4), rel=1e-9)


@pytest.mark.parametrize("held_out, message", [
    ([False, False, False], "at least one held-out"),
    ([True, True, False], "two distinct"),
    ([True, False], "one entry per size"),
])
def test_fit_held_out_rejects_bad_splits(held_out, message):
    sizes = np.array([1e3, 1e4, 1e5])
    with pytest.raises(ValueError, match=message):
        costmodel.fit_held_out(sizes, _line(sizes), np.array(held_out))


def test_collective_alpha_beta_matches_collective_time():
    for algorithm in ("ring", "recursive_doubling", "rabenseifner", "tree"):
        line = costmodel.collective_alpha_beta("all_reduce", 8, 10e9, 5e-6, algorithm)
        for nbytes in (1024, 2**20, 3 * 2**24):
            expected = costmodel.collective_time("all_reduce", nbytes, 8, 10e9, 5e-6, algorithm)
            assert line.predict(nbytes) == pytest.approx(expected, rel=1e-12)


def test_collective_alpha_beta_ring_values():
    line = costmodel.collective_alpha_beta("all_reduce", 4, 2e9, 1e-5, "ring")
    assert line.alpha == pytest.approx(6 * 1e-5)          # 2(p-1) steps
    assert line.beta == pytest.approx(2 * 3 / 4 / 2e9)    # 2(p-1)/p bytes per byte


def test_collective_alpha_beta_rejects_bad_bandwidth():
    with pytest.raises(ValueError, match="bandwidth"):
        costmodel.collective_alpha_beta("all_reduce", 8, 0.0)


def test_crossover_ring_vs_recursive_doubling_closed_form():
    alpha, bandwidth, p = 20e-6, 5e9, 8
    ring = costmodel.collective_alpha_beta("all_reduce", p, bandwidth, alpha, "ring")
    doubling = costmodel.collective_alpha_beta("all_reduce", p, bandwidth, alpha,
                                               "recursive_doubling")
    # 2(p-1) a + 2(p-1)/p n b = log2(p) (a + n b)
    #   =>  n = (2(p-1) - log2 p) a / ((log2 p - 2(p-1)/p) b)
    expected = (14 - 3) * alpha / ((3 - 1.75) / bandwidth)
    assert costmodel.crossover_bytes(ring, doubling) == pytest.approx(expected)
    assert costmodel.crossover_bytes(doubling, ring) == pytest.approx(expected)
    below, above = expected / 2, expected * 2
    assert doubling.predict(below) < ring.predict(below)
    assert ring.predict(above) < doubling.predict(above)


def test_crossover_none_when_one_line_always_wins():
    fast = costmodel.AlphaBeta(alpha=1e-6, beta=1e-10)
    slow = costmodel.AlphaBeta(alpha=2e-6, beta=2e-10)
    assert math.isinf(costmodel.crossover_bytes(fast, slow))
    assert math.isinf(costmodel.crossover_bytes(fast, costmodel.AlphaBeta(5e-6, 1e-10)))
