"""clusterlab.analytic.costmodel against values derived by hand from the alpha-beta model.

Every expected value below is written out as the arithmetic one would do on paper
(Thakur, Rabenseifner & Gropp 2005; nccl-tests doc/PERFORMANCE.md), not computed by the
function under test.
"""

from __future__ import annotations

import math
from typing import get_args

import numpy as np
import pytest

from clusterlab.analytic import costmodel
from clusterlab.analytic.costmodel import _model, alpha_beta, cluster, traffic

ALPHA = 3e-6          # seconds per step
BW = 50e9             # bytes/s per device, per direction
M = 96 * 2**20        # a 96 MiB buffer, as nccl-tests' size column counts it


# --- busbw_factor ------------------------------------------------------------------------

BUSBW_FACTORS = [
    # all-reduce: 2(n-1)/n
    ("all_reduce", 1, 2 * 0 / 1),
    ("all_reduce", 2, 2 * 1 / 2),
    ("all_reduce", 4, 2 * 3 / 4),
    ("all_reduce", 6, 2 * 5 / 6),
    ("all_reduce", 8, 2 * 7 / 8),
    ("all_reduce", 16, 2 * 15 / 16),
    # all-gather, reduce-scatter, all-to-all: (n-1)/n
    ("all_gather", 2, 1 / 2),
    ("all_gather", 8, 7 / 8),
    ("all_gather", 6, 5 / 6),
    ("reduce_scatter", 4, 3 / 4),
    ("reduce_scatter", 16, 15 / 16),
    ("reduce_scatter", 3, 2 / 3),
    ("all_to_all", 2, 1 / 2),
    ("all_to_all", 8, 7 / 8),
    ("all_to_all", 5, 4 / 5),
    # broadcast, reduce, send/recv: 1
    ("broadcast", 2, 1.0),
    ("broadcast", 8, 1.0),
    ("broadcast", 6, 1.0),
    ("reduce", 4, 1.0),
    ("reduce", 16, 1.0),
    ("send_recv", 2, 1.0),
    ("send_recv", 8, 1.0),
]


@pytest.mark.parametrize("op, n, expected", BUSBW_FACTORS)
def test_busbw_factor(op, n, expected):
    assert costmodel.busbw_factor(op, n) == pytest.approx(expected, rel=1e-12)


def test_busbw_factor_covers_every_op():
    assert {op for op, _, _ in BUSBW_FACTORS} == set(costmodel.OPS)


def test_algbw_and_busbw():
    # 64 MiB in 2 ms: algbw = 2**26 / 2e-3 bytes/s
    assert costmodel.algbw(2**26, 2e-3) == pytest.approx(2**26 / 2e-3)
    # all-reduce on 8 devices multiplies by 2*7/8
    assert costmodel.busbw("all_reduce", 2**26, 2e-3, 8) == pytest.approx(
        2**26 / 2e-3 * 2 * 7 / 8)
    assert costmodel.busbw("all_gather", 2**26, 2e-3, 4) == pytest.approx(2**26 / 2e-3 * 3 / 4)
    assert costmodel.busbw("broadcast", 2**26, 2e-3, 16) == pytest.approx(2**26 / 2e-3)


# --- collective_time for every (op, algorithm) pair -----------------------------------------

# (op, algorithm, n, expected seconds); log2 of 2, 4, 8, 16 is 1, 2, 3, 4.
COLLECTIVE_TIMES = [
    # all-reduce, ring: 2(n-1) steps, 2(n-1)/n of the buffer sent
    ("all_reduce", "ring", 2, 2 * 1 * ALPHA + 2 * 1 / 2 * M / BW),
    ("all_reduce", "ring", 4, 2 * 3 * ALPHA + 2 * 3 / 4 * M / BW),
    ("all_reduce", "ring", 8, 2 * 7 * ALPHA + 2 * 7 / 8 * M / BW),
    ("all_reduce", "ring", 16, 2 * 15 * ALPHA + 2 * 15 / 16 * M / BW),
    ("all_reduce", "ring", 6, 2 * 5 * ALPHA + 2 * 5 / 6 * M / BW),
    # all-reduce, recursive doubling: log2 n steps, the whole buffer each step
    ("all_reduce", "recursive_doubling", 2, 1 * ALPHA + 1 * M / BW),
    ("all_reduce", "recursive_doubling", 4, 2 * ALPHA + 2 * M / BW),
    ("all_reduce", "recursive_doubling", 8, 3 * ALPHA + 3 * M / BW),
    ("all_reduce", "recursive_doubling", 16, 4 * ALPHA + 4 * M / BW),
    # all-reduce, Rabenseifner: 2 log2 n steps, 2(n-1)/n of the buffer
    ("all_reduce", "rabenseifner", 2, 2 * 1 * ALPHA + 2 * 1 / 2 * M / BW),
    ("all_reduce", "rabenseifner", 4, 2 * 2 * ALPHA + 2 * 3 / 4 * M / BW),
    ("all_reduce", "rabenseifner", 8, 2 * 3 * ALPHA + 2 * 7 / 8 * M / BW),
    ("all_reduce", "rabenseifner", 16, 2 * 4 * ALPHA + 2 * 15 / 16 * M / BW),
    # all-reduce, binomial tree: reduce then broadcast, 2 log2 n steps of the whole buffer
    ("all_reduce", "tree", 2, 2 * 1 * ALPHA + 2 * 1 * M / BW),
    ("all_reduce", "tree", 4, 2 * 2 * ALPHA + 2 * 2 * M / BW),
    ("all_reduce", "tree", 8, 2 * 3 * ALPHA + 2 * 3 * M / BW),
    ("all_reduce", "tree", 16, 2 * 4 * ALPHA + 2 * 4 * M / BW),
    # all-reduce in the network (a reducing switch): up once, down once, one buffer each way
    ("all_reduce", "in_network", 2, 2 * ALPHA + M / BW),
    ("all_reduce", "in_network", 4, 2 * ALPHA + M / BW),
    ("all_reduce", "in_network", 8, 2 * ALPHA + M / BW),
    ("all_reduce", "in_network", 16, 2 * ALPHA + M / BW),
    ("all_reduce", "in_network", 6, 2 * ALPHA + M / BW),
    # all-gather, ring: n-1 steps, (n-1)/n of the gathered buffer
    ("all_gather", "ring", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("all_gather", "ring", 4, 3 * ALPHA + 3 / 4 * M / BW),
    ("all_gather", "ring", 8, 7 * ALPHA + 7 / 8 * M / BW),
    ("all_gather", "ring", 16, 15 * ALPHA + 15 / 16 * M / BW),
    ("all_gather", "ring", 6, 5 * ALPHA + 5 / 6 * M / BW),
    # all-gather, recursive doubling: log2 n steps, still (n-1)/n of the buffer
    ("all_gather", "recursive_doubling", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("all_gather", "recursive_doubling", 4, 2 * ALPHA + 3 / 4 * M / BW),
    ("all_gather", "recursive_doubling", 8, 3 * ALPHA + 7 / 8 * M / BW),
    ("all_gather", "recursive_doubling", 16, 4 * ALPHA + 15 / 16 * M / BW),
    # reduce-scatter, ring
    ("reduce_scatter", "ring", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("reduce_scatter", "ring", 4, 3 * ALPHA + 3 / 4 * M / BW),
    ("reduce_scatter", "ring", 8, 7 * ALPHA + 7 / 8 * M / BW),
    ("reduce_scatter", "ring", 16, 15 * ALPHA + 15 / 16 * M / BW),
    ("reduce_scatter", "ring", 6, 5 * ALPHA + 5 / 6 * M / BW),
    # reduce-scatter, recursive halving
    ("reduce_scatter", "recursive_halving", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("reduce_scatter", "recursive_halving", 4, 2 * ALPHA + 3 / 4 * M / BW),
    ("reduce_scatter", "recursive_halving", 8, 3 * ALPHA + 7 / 8 * M / BW),
    ("reduce_scatter", "recursive_halving", 16, 4 * ALPHA + 15 / 16 * M / BW),
    # all-to-all, ring and pairwise exchange: n-1 steps, (n-1)/n of the buffer
    ("all_to_all", "ring", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("all_to_all", "ring", 4, 3 * ALPHA + 3 / 4 * M / BW),
    ("all_to_all", "ring", 8, 7 * ALPHA + 7 / 8 * M / BW),
    ("all_to_all", "ring", 16, 15 * ALPHA + 15 / 16 * M / BW),
    ("all_to_all", "ring", 6, 5 * ALPHA + 5 / 6 * M / BW),
    ("all_to_all", "pairwise", 2, 1 * ALPHA + 1 / 2 * M / BW),
    ("all_to_all", "pairwise", 4, 3 * ALPHA + 3 / 4 * M / BW),
    ("all_to_all", "pairwise", 8, 7 * ALPHA + 7 / 8 * M / BW),
    ("all_to_all", "pairwise", 16, 15 * ALPHA + 15 / 16 * M / BW),
    ("all_to_all", "pairwise", 6, 5 * ALPHA + 5 / 6 * M / BW),
    # broadcast, ring (pipelined chain): n-1 steps, one whole buffer
    ("broadcast", "ring", 2, 1 * ALPHA + M / BW),
    ("broadcast", "ring", 4, 3 * ALPHA + M / BW),
    ("broadcast", "ring", 8, 7 * ALPHA + M / BW),
    ("broadcast", "ring", 16, 15 * ALPHA + M / BW),
    ("broadcast", "ring", 6, 5 * ALPHA + M / BW),
    # broadcast, binomial tree: log2 n steps of the whole buffer
    ("broadcast", "tree", 2, 1 * ALPHA + 1 * M / BW),
    ("broadcast", "tree", 4, 2 * ALPHA + 2 * M / BW),
    ("broadcast", "tree", 8, 3 * ALPHA + 3 * M / BW),
    ("broadcast", "tree", 16, 4 * ALPHA + 4 * M / BW),
    # reduce: the mirror image of broadcast
    ("reduce", "ring", 2, 1 * ALPHA + M / BW),
    ("reduce", "ring", 4, 3 * ALPHA + M / BW),
    ("reduce", "ring", 8, 7 * ALPHA + M / BW),
    ("reduce", "ring", 16, 15 * ALPHA + M / BW),
    ("reduce", "ring", 6, 5 * ALPHA + M / BW),
    ("reduce", "tree", 2, 1 * ALPHA + 1 * M / BW),
    ("reduce", "tree", 4, 2 * ALPHA + 2 * M / BW),
    ("reduce", "tree", 8, 3 * ALPHA + 3 * M / BW),
    ("reduce", "tree", 16, 4 * ALPHA + 4 * M / BW),
    # send/recv: one step, one buffer, whatever n
    ("send_recv", "ring", 2, 1 * ALPHA + M / BW),
    ("send_recv", "ring", 4, 1 * ALPHA + M / BW),
    ("send_recv", "ring", 8, 1 * ALPHA + M / BW),
    ("send_recv", "ring", 16, 1 * ALPHA + M / BW),
    ("send_recv", "ring", 6, 1 * ALPHA + M / BW),
]


@pytest.mark.parametrize("op, algorithm, n, expected", COLLECTIVE_TIMES)
def test_collective_time(op, algorithm, n, expected):
    got = costmodel.collective_time(op, M, n, BW, ALPHA, algorithm=algorithm)
    assert got == pytest.approx(expected, rel=1e-12)


def test_collective_time_table_covers_every_algorithm():
    covered = {(op, algorithm) for op, algorithm, _, _ in COLLECTIVE_TIMES}
    assert covered == {(op, a) for op, algs in costmodel.ALGORITHMS.items() for a in algs}
    for op, algorithm in covered:
        ns = {n for o, a, n, _ in COLLECTIVE_TIMES if (o, a) == (op, algorithm)}
        assert {2, 4, 8, 16} <= ns, (op, algorithm)


@pytest.mark.parametrize("op, algorithm", [(op, a) for op, algs in costmodel.ALGORITHMS.items()
                                           for a in algs])
def test_one_device_costs_nothing(op, algorithm):
    assert costmodel.collective_steps_and_bytes(op, M, 1, algorithm) == (0, 0.0)
    assert costmodel.collective_time(op, M, 1, BW, ALPHA, algorithm=algorithm) == 0.0


def test_steps_and_bytes():
    assert costmodel.collective_steps_and_bytes("all_reduce", 800, 8) == (14, 2 * 7 / 8 * 800)
    assert costmodel.collective_steps_and_bytes("all_reduce", 800, 8, "recursive_doubling") == (
        3, 3 * 800.0)
    assert costmodel.collective_steps_and_bytes("all_gather", 600, 6) == (5, 5 / 6 * 600)
    assert costmodel.collective_steps_and_bytes("send_recv", 600, 6) == (1, 600.0)


def test_default_algorithm_is_ring_and_default_latency_zero():
    assert costmodel.collective_time("all_reduce", M, 8, BW) == pytest.approx(
        2 * 7 / 8 * M / BW)


@pytest.mark.parametrize("op", costmodel.OPS)
@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_ring_busbw_equals_link_bandwidth_without_latency(op, n):
    # nccl-tests' reason for busbw: with the ring and no latency it is the link speed.
    seconds = costmodel.collective_time(op, M, n, BW, 0.0, algorithm="ring")
    assert costmodel.busbw(op, M, seconds, n) == pytest.approx(BW, rel=1e-12)


# --- errors --------------------------------------------------------------------------------

def test_unknown_op():
    with pytest.raises(ValueError, match=r"Unknown collective 'allreduce'.*all_reduce"):
        costmodel.collective_time("allreduce", M, 8, BW)
    with pytest.raises(ValueError, match=r"Unknown collective 'gather'"):
        costmodel.busbw_factor("gather", 8)
    with pytest.raises(ValueError, match=r"Unknown collective 'scan'"):
        costmodel.busbw("scan", M, 1.0, 8)


@pytest.mark.parametrize("op, algorithm", [("all_reduce", "butterfly"), ("all_to_all", "tree"),
                                           ("send_recv", "tree"), ("broadcast", "pairwise")])
def test_unknown_algorithm(op, algorithm):
    with pytest.raises(ValueError, match=rf"Unknown algorithm '{algorithm}' for {op}"):
        costmodel.collective_time(op, M, 8, BW, algorithm=algorithm)


@pytest.mark.parametrize("op, algorithm", [("all_reduce", "recursive_doubling"),
                                           ("all_reduce", "rabenseifner"),
                                           ("all_reduce", "tree"),
                                           ("all_gather", "recursive_doubling"),
                                           ("reduce_scatter", "recursive_halving"),
                                           ("broadcast", "tree"), ("reduce", "tree")])
@pytest.mark.parametrize("n", [3, 6, 12])
def test_power_of_two_algorithms_reject_other_counts(op, algorithm, n):
    with pytest.raises(ValueError, match=rf"power-of-two device count, got n_devices={n}"):
        costmodel.collective_time(op, M, n, BW, ALPHA, algorithm=algorithm)


@pytest.mark.parametrize("nbytes", [0, -1, -M, math.nan, math.inf])
def test_non_positive_sizes(nbytes):
    with pytest.raises(ValueError, match="nbytes must be a positive finite number"):
        costmodel.collective_time("all_reduce", nbytes, 8, BW)
    with pytest.raises(ValueError, match="nbytes must be a positive finite number"):
        costmodel.algbw(nbytes, 1.0)


@pytest.mark.parametrize("bandwidth", [0, -1.0, math.nan])
def test_non_positive_bandwidth(bandwidth):
    with pytest.raises(ValueError, match="bandwidth must be a positive finite number"):
        costmodel.collective_time("all_reduce", M, 8, bandwidth)


def test_negative_latency():
    with pytest.raises(ValueError, match="latency must be a non-negative finite number"):
        costmodel.collective_time("all_reduce", M, 8, BW, -1e-6)


@pytest.mark.parametrize("seconds", [0, -1.0])
def test_non_positive_time(seconds):
    with pytest.raises(ValueError, match="seconds must be a positive finite number"):
        costmodel.algbw(M, seconds)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_bad_device_counts(n):
    with pytest.raises(ValueError, match="n_devices must be a positive integer|n_devices must be a number"):
        costmodel.collective_time("all_reduce", M, n, BW)
    with pytest.raises(ValueError, match="n_devices must be a positive integer|n_devices must be a number"):
        costmodel.busbw_factor("all_reduce", n)


# --- AlphaBeta and fit_alpha_beta ------------------------------------------------------------

def _relative_error(alpha, beta, sizes, times):
    return float(np.sum(((alpha + beta * sizes) / times - 1.0) ** 2))


SIZES = np.array([2.0**k for k in range(10, 27)])  # 1 KiB .. 64 MiB


def test_alpha_beta_predict_and_bandwidth():
    model = costmodel.AlphaBeta(alpha=2e-6, beta=1 / 25e9)
    assert model.bandwidth == pytest.approx(25e9)
    assert isinstance(model.predict(1e6), float)
    assert model.predict(1e6) == pytest.approx(2e-6 + 1e6 / 25e9)
    np.testing.assert_allclose(model.predict([0, 1e6]), [2e-6, 2e-6 + 1e6 / 25e9])
    assert costmodel.AlphaBeta(alpha=1e-6, beta=0.0).bandwidth == math.inf


def test_fit_recovers_exact_line():
    times = 15e-6 + SIZES / 12e9
    fit = costmodel.fit_alpha_beta(SIZES, times)
    assert fit.alpha == pytest.approx(15e-6, rel=1e-9)
    assert fit.beta == pytest.approx(1 / 12e9, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_parameters_from_noisy_data(seed):
    rng = np.random.default_rng(seed)
    alpha, bandwidth = 20e-6, 10e9
    sizes = np.repeat(SIZES, 3)  # three measurements per size
    times = (alpha + sizes / bandwidth) * (1 + 0.02 * rng.standard_normal(sizes.size))
    fit = costmodel.fit_alpha_beta(sizes, times)
    assert fit.alpha == pytest.approx(alpha, rel=0.03)
    assert fit.beta == pytest.approx(1 / bandwidth, rel=0.03)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=0.03)


def test_fit_minimises_relative_not_absolute_error():
    # The largest message would decide alpha in an ordinary least-squares fit; with relative
    # errors a 5% outlier at 64 MiB leaves alpha where the small messages put it.
    times = 20e-6 + SIZES / 10e9
    times[-1] *= 1.05
    fit = costmodel.fit_alpha_beta(SIZES, times)
    assert fit.alpha == pytest.approx(20e-6, rel=0.05)
    best = _relative_error(fit.alpha, fit.beta, SIZES, times)
    for da, db in [(1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)]:
        assert _relative_error(fit.alpha * da, fit.beta * db, SIZES, times) > best


def test_fit_pure_bandwidth_branch():
    # Times slightly below a line through the origin: the unconstrained intercept is
    # negative, so the fit falls back to alpha = 0 and a bandwidth-only line.
    beta = 1 / 10e9
    times = beta * SIZES - 1e-8
    fit = costmodel.fit_alpha_beta(SIZES, times)
    assert fit.alpha == 0.0
    assert fit.beta == pytest.approx(beta, rel=0.05)
    best = _relative_error(0.0, fit.beta, SIZES, times)
    assert _relative_error(0.0, fit.beta * 1.01, SIZES, times) > best
    assert _relative_error(0.0, fit.beta * 0.99, SIZES, times) > best


def test_fit_pure_latency_branch():
    # Times that fall (slightly) with size: the unconstrained slope is negative, so the fit
    # falls back to beta = 0 and a latency-only line.
    alpha = 5e-6
    times = alpha * (1 - 0.01 * SIZES / SIZES.max())
    fit = costmodel.fit_alpha_beta(SIZES, times)
    assert fit.beta == 0.0
    assert fit.bandwidth == math.inf
    assert fit.alpha == pytest.approx(alpha, rel=0.02)
    best = _relative_error(fit.alpha, 0.0, SIZES, times)
    assert _relative_error(fit.alpha * 1.001, 0.0, SIZES, times) > best
    assert _relative_error(fit.alpha * 0.999, 0.0, SIZES, times) > best


def test_fit_errors():
    with pytest.raises(ValueError, match="equal length"):
        costmodel.fit_alpha_beta([1, 2, 3], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="two distinct message sizes"):
        costmodel.fit_alpha_beta([1024, 1024], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="seconds must be a positive finite number"):
        costmodel.fit_alpha_beta([1024, 2048], [1e-6, 0.0])
    with pytest.raises(ValueError, match="nbytes must be a positive finite number"):
        costmodel.fit_alpha_beta([-1024, 2048], [1e-6, 2e-6])


def test_megatron_all_reduces_per_layer():
    # Two column-then-row pairs per layer (attention, MLP): one all-reduce each per pass.
    assert costmodel.megatron_all_reduces_per_layer(backward=False) == 2
    assert costmodel.megatron_all_reduces_per_layer(backward=True) == 4
    assert costmodel.megatron_all_reduces_per_layer(backward=True, recompute=True) == 6
    with pytest.raises(ValueError, match="give backward=True"):
        costmodel.megatron_all_reduces_per_layer(backward=False, recompute=True)
    # The per-step traffic of a layer's two pairs counts the same all-reduces.
    traffic = costmodel.tensor_parallel_bytes_per_step(16, 64, costmodel.MEGATRON_PAIRS_PER_LAYER,
                                                       4)
    assert traffic.all_reduces == costmodel.megatron_all_reduces_per_layer(backward=True)


def test_the_literal_option_types_name_every_option():
    # The Literal types of the signatures list exactly the options the functions accept.
    assert set(get_args(alpha_beta.Op)) == set(costmodel.OPS)
    assert set(get_args(alpha_beta.Algorithm)) == {a for algorithms in
                                                   costmodel.ALGORITHMS.values()
                                                   for a in algorithms}
    assert set(get_args(traffic.Schedule)) == set(costmodel.PIPELINE_SCHEDULES)
    assert set(get_args(_model.FabricKind)) == set(costmodel.FABRICS)
    assert set(get_args(cluster.ClusterAlgorithm)) == {"auto", *costmodel.CLUSTER_ALGORITHMS}
    assert set(get_args(cluster.Protocol)) == {"auto", *costmodel.PROTOCOLS}


def test_nccls_all_reduce_picks_on_h100_and_h200_servers():
    # Lab 02's table: the algorithm the course's NCCL tuning model picks by nodes and size.
    from clusterlab.catalog import hardware

    nodes, sizes = (1, 2, 4, 8), (2**20, 2**26, 2**30, 2**32)

    def pick(gpu, n_nodes, nbytes):
        network = {} if n_nodes == 1 else {"n_nodes": n_nodes, "nic": "IB-NDR"}
        return costmodel.cluster_collective("all_reduce", nbytes,
                                            hardware.ClusterSpec(gpu=gpu, **network)).algorithm

    picks = {(n, s): pick("H100", n, s) for n in nodes for s in sizes}
    assert all(pick("H200", *key) == algorithm for key, algorithm in picks.items())
    assert all(picks[1, s] == "nvls" for s in sizes[1:])
    assert picks[2, 2**20] == "tree" and all(picks[2, s] == "nvls_tree" for s in sizes[1:])
    ring_across = {key for key, algorithm in picks.items() if algorithm == "ring" and key[0] > 1}
    assert ring_across and ring_across <= {(n, s) for n in nodes if n >= 4 for s in sizes
                                          if s >= 2**30}
