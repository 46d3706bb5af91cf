"""Unit tests of the helpers lab 01 (measuring collectives) adds to clusterlab."""

import numpy as np
import pytest

from clusterlab import costmodel


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
