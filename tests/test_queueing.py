"""Queueing formulas (clusterlab.analytic.queueing) against closed forms and a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clusterlab.analytic import queueing


def test_erlang_c_closed_forms():
    # One server: an arrival waits whenever the server is busy, with probability rho.
    assert queueing.erlang_c(1, 0.7) == pytest.approx(0.7)
    # Two servers, a = 1: P0 = 1/3 and C = a^c / (c! (1 - rho)) * P0 = 1/3.
    assert queueing.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # Ten servers: the textbook sum (Harchol-Balter 2013, Chapter 14).
    c, a = 10, 8.0
    tail = a**c / math.factorial(c) / (1 - a / c)
    textbook = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    assert queueing.erlang_c(c, a) == pytest.approx(textbook, rel=1e-12)
    # Thousands of servers: the recursion stays finite where a^k / k! overflows.
    assert 0 < queueing.erlang_c(2000, 1990.0) < 1


def test_mmc_wait_reduces_to_mm1():
    # M/M/1: W_q = rho S / (1 - rho).
    assert queueing.mmc_mean_wait_s(0.8, 1.0, 1) == pytest.approx(0.8 / 0.2)
    # Pooling: at the same load per server, more servers wait far less.
    assert queueing.mmc_mean_wait_s(80.0, 1.0, 100) < 0.01 * queueing.mmc_mean_wait_s(0.8, 1.0, 1)


def test_md1_is_half_of_mm1_and_matches_a_simulation():
    rho, service = 0.8, 0.1
    md1 = queueing.md1_mean_wait_s(rho / service, service)
    assert md1 == pytest.approx(0.5 * queueing.mmc_mean_wait_s(rho / service, service, 1))
    # Lindley's recursion W_{n+1} = max(0, W_n + S - A_{n+1}) with Poisson arrivals.
    gaps = np.random.default_rng(0).exponential(service / rho, 400_000)      # f64[n]
    wait, total = 0.0, 0.0
    for gap in gaps:
        wait = max(0.0, wait + service - gap)
        total += wait
    assert total / len(gaps) == pytest.approx(md1, rel=0.05)


def test_littles_law_and_unstable_queues():
    assert queueing.requests_in_system(30.0, 2.0) == 60.0
    with pytest.raises(ValueError, match="grows without bound"):
        queueing.md1_mean_wait_s(10.0, 0.1)
    with pytest.raises(ValueError, match="below servers"):
        queueing.erlang_c(4, 4.0)


def test_decode_batch_for_rate_solves_littles_law():
    def tpot(b: int) -> float:          # a memory-bound step: fixed weights plus a cache each
        return 0.010 + 0.0001 * b
    rate, tokens = 20.0, 100
    b = queueing.decode_batch_for_rate(rate, tokens, tpot, max_batch=1000)
    # b = rate * tokens * (0.01 + 1e-4 b)  ->  b = 20 / (1 - 0.2) = 25
    assert b == 25
    assert b >= rate * tokens * tpot(b) and b - 1 < rate * tokens * tpot(b - 1)
    with pytest.raises(ValueError, match="add replicas"):
        queueing.decode_batch_for_rate(rate, tokens, tpot, max_batch=20)
