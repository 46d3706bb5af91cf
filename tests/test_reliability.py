"""Unit tests of clusterlab.analytic.reliability against hand-derived and published values."""

import math

import numpy as np
import pytest

from clusterlab.analytic import reliability as rel

HOUR_S = 3600.0
DAY_S = 86400.0


def test_cluster_mtbf_divides_by_gpu_count():
    assert rel.cluster_mtbf_s(1e6, 1) == 1e6
    assert rel.cluster_mtbf_s(1e6, 1000) == pytest.approx(1e3)
    assert rel.failure_rate_per_s(1e6, 1000) == pytest.approx(1e-3)
    assert rel.failure_rate_per_s(50.0) == pytest.approx(0.02)


def test_llama3_published_failures_round_trip():
    # Dubey et al. 2024, Sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100s,
    # "one failure every three hours" on average.
    per_gpu = rel.mtbf_from_failures_s(419, 54 * DAY_S, 16384)
    job = rel.cluster_mtbf_s(per_gpu, 16384)
    assert job / HOUR_S == pytest.approx(54 * 24 / 419)
    assert 3.0 < job / HOUR_S < 3.2
    assert rel.expected_failures(16384, per_gpu, 54 * DAY_S) == pytest.approx(419)
    # the same GPUs, a 1024-GPU job: 16 times fewer failures
    assert rel.expected_failures(1024, per_gpu, 54 * DAY_S) == pytest.approx(419 / 16)


def test_probability_no_failure():
    assert rel.probability_no_failure(1, 100.0, 0.0) == 1.0
    assert rel.probability_no_failure(10, 100.0, 10.0) == pytest.approx(math.exp(-1))


def test_young_interval_hand_computed():
    # delta = 5 min, M = 24 h: sqrt(2 * 300 * 86400) = sqrt(51,840,000) = 7200 s = 2 h.
    assert rel.young_interval_s(300.0, DAY_S) == pytest.approx(7200.0)
    # delta = 50 s, M = 1 h: sqrt(2 * 50 * 3600) = 600 s.
    assert rel.young_interval_s(50.0, HOUR_S) == pytest.approx(600.0)


@pytest.mark.parametrize("mtbf_min,expected_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_matches_published_examples(mtbf_min, expected_min):
    # Daly 2006, Figs. 3-5: delta = 5 min, R = 10 min; the model predicts
    # tau_opt = 117 min (M = 24 h), 57 min (M = 6 h) and 9.1 min (M = 15 min).
    value_min = rel.daly_interval_s(5 * 60.0, mtbf_min * 60.0) / 60.0
    assert value_min == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_daly_close_to_young_when_checkpoints_are_cheap_and_capped_otherwise():
    young = rel.young_interval_s(1.0, 1e6)
    assert rel.daly_interval_s(1.0, 1e6) == pytest.approx(young, rel=2e-3)
    # delta >= 2M: Daly's interval is M itself
    assert rel.daly_interval_s(300.0, 100.0) == 100.0


def test_expected_lost_fraction_hand_computed():
    # delta/tau + (tau/2 + R)/M = 60/600 + (300 + 120)/3600 = 0.1 + 0.11667
    assert rel.expected_lost_fraction(600.0, 60.0, 3600.0, restart_s=120.0) == pytest.approx(
        0.1 + 420.0 / 3600.0)
    # at Young's interval the two interval-dependent terms are equal: both sqrt(delta / 2M)
    tau = rel.young_interval_s(60.0, 3600.0)
    assert rel.expected_lost_fraction(tau, 60.0, 3600.0) == pytest.approx(
        2 * math.sqrt(60.0 / (2 * 3600.0)))


@pytest.mark.parametrize("restart_s", [0.0, 600.0])
def test_minimum_of_expected_lost_fraction_is_young_interval(restart_s):
    delta, mtbf = 120.0, 3.0 * HOUR_S
    intervals = np.linspace(10.0, 10_000.0, 200_001)  # f64[200001], 0.05 s apart
    lost = rel.expected_lost_fraction(intervals, delta, mtbf, restart_s=restart_s)
    assert lost.shape == intervals.shape
    best = intervals[np.argmin(lost)]
    assert best == pytest.approx(rel.young_interval_s(delta, mtbf), abs=0.1)


def test_synchronous_step_times_are_max_over_gpus_and_seeded():
    one = rel.synchronous_step_times_s(1, 20_000, mean_step_s=1.0, std_step_s=0.05, seed=1)
    many = rel.synchronous_step_times_s(1024, 2_000, mean_step_s=1.0, std_step_s=0.05, seed=1)
    assert one.shape == (20_000,) and many.shape == (2_000,)
    assert np.mean(one) == pytest.approx(1.0, abs=0.002)
    # expected max of 1024 standard normals is about 3.2 (sqrt(2 ln n) = 3.72 is an upper bound)
    assert 1.0 + 0.05 * 3.0 < np.mean(many) < 1.0 + 0.05 * math.sqrt(2 * math.log(1024))
    again = rel.synchronous_step_times_s(1024, 2_000, mean_step_s=1.0, std_step_s=0.05, seed=1)
    np.testing.assert_array_equal(many, again)
    # no noise: every step takes the mean
    flat = rel.synchronous_step_times_s(64, 5, mean_step_s=0.3, std_step_s=0.0)
    np.testing.assert_allclose(flat, 0.3)


@pytest.mark.parametrize("call,name", [
    (lambda: rel.cluster_mtbf_s(0.0, 8), "per_gpu_mtbf_s"),
    (lambda: rel.cluster_mtbf_s(-5.0, 8), "per_gpu_mtbf_s"),
    (lambda: rel.cluster_mtbf_s(1e6, 0), "n_gpus"),
    (lambda: rel.cluster_mtbf_s(1e6, 2.5), "n_gpus"),
    (lambda: rel.expected_failures(8, 1e6, -1.0), "duration_s"),
    (lambda: rel.mtbf_from_failures_s(0, 1e6, 8), "n_failures"),
    (lambda: rel.young_interval_s(0.0, 3600.0), "checkpoint_write_s"),
    (lambda: rel.young_interval_s(60.0, -1.0), "mtbf_s"),
    (lambda: rel.daly_interval_s(60.0, 0.0), "mtbf_s"),
    (lambda: rel.expected_lost_fraction(0.0, 60.0, 3600.0), "interval_s"),
    (lambda: rel.expected_lost_fraction([600.0, -1.0], 60.0, 3600.0), "interval_s"),
    (lambda: rel.expected_lost_fraction(600.0, 60.0, 3600.0, restart_s=-1), "restart_s"),
    (lambda: rel.synchronous_step_times_s(0, 5, mean_step_s=1.0, std_step_s=0.1), "n_gpus"),
    (lambda: rel.synchronous_step_times_s(4, 5, mean_step_s=1.0, std_step_s=-0.1), "std_step_s"),
])
def test_errors_name_the_constraint(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --- goodput, interruption shares, hot spares ---------------------------------------------------

def test_goodput_without_failures_is_the_checkpoint_duty_cycle():
    # M -> infinity: every segment of tau seconds of work costs tau + delta of wall time.
    assert rel.goodput_fraction(900.0, 100.0, 1e15) == pytest.approx(0.9, rel=1e-9)
    assert rel.goodput_fraction(900.0, 0.0, 1e15, restart_s=600.0) == pytest.approx(1.0, rel=1e-9)


def test_goodput_hand_computed_from_dalys_complete_model():
    # tau = 1 h, delta = 0, R = 0, M = 1 h: wall per segment = M (e - 1), goodput = 1 / (e - 1).
    assert rel.goodput_fraction(HOUR_S, 0.0, HOUR_S) == pytest.approx(1 / (math.e - 1))
    # with R = M the wall time is multiplied by e
    assert rel.goodput_fraction(HOUR_S, 0.0, HOUR_S, restart_s=HOUR_S) == pytest.approx(
        1 / (math.e * (math.e - 1)))


def test_goodput_agrees_with_first_order_loss_when_failures_are_rare():
    mtbf = 30 * DAY_S
    tau, delta, restart = 1800.0, 10.0, 600.0
    good = rel.goodput_fraction(tau, delta, mtbf, restart)
    lost = rel.expected_lost_fraction(tau, delta, mtbf, restart)
    assert 1 - good == pytest.approx(lost, rel=0.01)
    # and the first-order model breaks where the complete one stays in (0, 1)
    assert rel.expected_lost_fraction(4 * HOUR_S, 600.0, HOUR_S, 1800.0) > 1
    assert 0 < rel.goodput_fraction(4 * HOUR_S, 600.0, HOUR_S, 1800.0) < 0.1


def test_goodput_is_vectorised_and_peaks_near_dalys_interval():
    mtbf, delta = 3 * HOUR_S, 60.0
    taus = np.linspace(60.0, 3 * HOUR_S, 20_000)
    good = rel.goodput_fraction(taus, delta, mtbf, 300.0)
    assert good.shape == taus.shape and np.all((good > 0) & (good < 1))
    best = taus[np.argmax(good)]
    assert best == pytest.approx(rel.daly_interval_s(delta, mtbf), rel=0.02)


def test_llama3_interruption_table_adds_up_and_matches_published_shares():
    counts = [n for _, n in rel.LLAMA3_405B_INTERRUPTIONS.values()]
    assert sum(counts) == 419
    # Table 5's percentages, except "Faulty GPU" (published 30.1%, which is not 148 / 419)
    published_pct = {"GPU HBM3 memory": 17.2, "Software bug": 12.9, "Network switch/cable": 8.4,
                     "Host maintenance": 7.6, "GPU SRAM memory": 4.5,
                     "GPU system processor": 4.1, "NIC": 1.7, "Silent data corruption": 1.4}
    for component, pct in published_pct.items():
        assert 100 * rel.LLAMA3_405B_INTERRUPTIONS[component][1] / 419 == pytest.approx(
            pct, abs=0.05)


def test_interruption_shares_group_by_category():
    shares = rel.interruption_shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert list(shares)[0] == "GPU"
    assert shares["GPU"] == pytest.approx((148 + 72 + 19 + 17 + 6 + 6) / 419)
    assert shares["Network"] == pytest.approx(35 / 419)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
    assert rel.interruption_shares({"a": ("x", 1), "b": ("y", 3), "c": ("x", 0)}) == {
        "y": 0.75, "x": 0.25}


def test_spare_nodes_cover_the_poisson_quantile():
    # mean out for repair = 100 nodes * 1 day / 100 days = 1; P(0) = e^-1, P(<=1) = 2/e = 0.736,
    # P(<=2) = 2.5/e = 0.920, P(<=3) = (8/3)/e = 0.981, P(<=4) = (65/24)/e = 0.996
    assert rel.spare_nodes_needed(100, 100 * DAY_S, DAY_S, confidence=0.5) == 1
    assert rel.spare_nodes_needed(100, 100 * DAY_S, DAY_S, confidence=0.9) == 2
    assert rel.spare_nodes_needed(100, 100 * DAY_S, DAY_S, confidence=0.99) == 4
    # more nodes, or longer repairs, need more spares
    assert rel.spare_nodes_needed(1000, 100 * DAY_S, DAY_S) > rel.spare_nodes_needed(
        100, 100 * DAY_S, DAY_S)


@pytest.mark.parametrize("call,name", [
    (lambda: rel.goodput_fraction(0.0, 60.0, 3600.0), "interval_s"),
    (lambda: rel.goodput_fraction(600.0, -1.0, 3600.0), "checkpoint_write_s"),
    (lambda: rel.goodput_fraction(600.0, 60.0, 0.0), "mtbf_s"),
    (lambda: rel.goodput_fraction(600.0, 60.0, 3600.0, restart_s=-5), "restart_s"),
    (lambda: rel.interruption_shares({"a": ("x", 0)}), "all counts are 0"),
    (lambda: rel.interruption_shares({"a": ("x", -1)}), "count of 'a'"),
    (lambda: rel.interruption_shares({"a": ("x", 1.5)}), "count of 'a'"),
    (lambda: rel.spare_nodes_needed(0, DAY_S, 3600.0), "n_nodes"),
    (lambda: rel.spare_nodes_needed(8, 0.0, 3600.0), "node_mtbf_s"),
    (lambda: rel.spare_nodes_needed(8, DAY_S, 0.0), "repair_s"),
    (lambda: rel.spare_nodes_needed(8, DAY_S, 2 * DAY_S), "well below 1"),
    (lambda: rel.spare_nodes_needed(8, DAY_S, 3600.0, confidence=1.0), "confidence"),
])
def test_new_reliability_errors_name_the_constraint(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_daly_interval_matches_the_printed_formula_and_the_large_delta_branch():
    import math as _math
    from clusterlab.analytic import reliability as _r
    delta, mtbf = 120.0, 3 * 3600.0
    x = delta / (2 * mtbf)
    assert _r.daly_interval_s(delta, mtbf) == pytest.approx(
        _math.sqrt(2 * delta * mtbf) * (1 + _math.sqrt(x) / 3 + x / 9) - delta)
    assert _r.daly_interval_s(3 * mtbf, mtbf) == pytest.approx(mtbf)  # delta >= 2M
