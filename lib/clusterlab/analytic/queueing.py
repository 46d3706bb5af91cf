"""Queues in front of a serving replica: Little's law, the M/D/1 and M/M/c waits, the steady batch.

A serving replica is a queueing system. Requests arrive at a rate ``lambda`` (per second), stay
for a time ``T`` (waiting, then being served), and leave. Three results size it:

- **Little's law**: the mean number of requests in the system is ``L = lambda * T``, for any
  arrival pattern and any service order, as long as the system is stable (Little 1961).
- **M/D/1** (Poisson arrivals, one server, a fixed service time ``S``): the mean wait is the
  Pollaczek-Khinchine formula with no service-time variance, ``rho * S / (2 (1 - rho))`` with
  ``rho = lambda * S``. DistServe models a prefill instance this way (Zhong et al. 2024, Eq. 1).
- **M/M/c** (Poisson arrivals, ``c`` servers, exponential service times of mean ``S``): an
  arrival waits with the Erlang C probability, and the mean wait is
  ``C(c, a) * S / (c - a)`` with offered load ``a = lambda * S``.

Units: seconds, requests per second.

References:
    Little, "A Proof for the Queuing Formula: L = lambda W", Operations Research 9(3), 1961.
    https://doi.org/10.1287/opre.9.3.383
    Harchol-Balter, "Performance Modeling and Design of Computer Systems: Queueing Theory in
    Action", Cambridge University Press 2013: Chapter 6 (Little's law), Chapter 14 (M/M/k and
    Erlang C), Chapter 23 (M/G/1 and the Pollaczek-Khinchine formula).
    Zhong et al., "DistServe", OSDI 2024, Section 3.1. https://arxiv.org/abs/2401.09670
"""

from __future__ import annotations

from typing import Callable

from clusterlab import _checks

__all__ = [
    "requests_in_system",
    "md1_mean_wait_s",
    "erlang_c",
    "mmc_mean_wait_s",
    "decode_batch_for_rate",
]


def requests_in_system(arrival_rate_per_s: float, time_in_system_s: float) -> float:
    """Little's law: mean requests in the system, ``L = lambda * T``.

    Args:
        arrival_rate_per_s: requests arriving per second (>= 0).
        time_in_system_s: mean time a request stays, waiting plus service (>= 0).

    Returns:
        The mean number of requests present (for a decode server: sequences in the batch).

    References:
        Little 1961; Harchol-Balter 2013, Chapter 6.
    """
    return (_checks.positive("arrival_rate_per_s", arrival_rate_per_s, allow_zero=True)
            * _checks.positive("time_in_system_s", time_in_system_s, allow_zero=True))


def _utilisation(arrival_rate_per_s: float, service_s: float, servers: int) -> float:
    # rho = lambda S / c; a queue with rho >= 1 grows without bound, so it has no mean wait
    rho = (_checks.positive("arrival_rate_per_s", arrival_rate_per_s, allow_zero=True)
           * _checks.positive("service_s", service_s) / _checks.count("servers", servers))
    if rho >= 1:
        raise ValueError(
            f"The load {rho:.3f} (arrival rate x service time / servers) is at or above 1: the "
            f"queue grows without bound. Lower arrival_rate_per_s below "
            f"{servers / service_s:.4g} per second, or add servers.")
    return rho


def md1_mean_wait_s(arrival_rate_per_s: float, service_s: float) -> float:
    """Mean time in the queue (before service) of an M/D/1 queue.

    Pollaczek-Khinchine with a fixed service time: ``W_q = rho * S / (2 (1 - rho))``,
    ``rho = lambda * S``. Half the M/M/1 wait at the same load: only the arrivals are random.

    Args:
        arrival_rate_per_s: Poisson arrival rate (>= 0).
        service_s: the fixed service time (> 0), e.g. one prompt's prefill.

    Returns:
        Seconds.

    Raises:
        ValueError: if ``rho >= 1`` (the queue is unstable); the message gives the largest rate.

    References:
        Harchol-Balter 2013, Chapter 23; Zhong et al. 2024 (DistServe), Section 3.1, Eq. 1.
    """
    rho = _utilisation(arrival_rate_per_s, service_s, 1)
    return rho * service_s / (2 * (1 - rho))


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival to an M/M/c queue must wait (all ``c`` servers busy).

    Computed from Erlang B by its recursion ``B_k = a B_{k-1} / (k + a B_{k-1})``, ``B_0 = 1``
    (stable for thousands of servers, unlike the textbook sum of ``a^k / k!``), then
    ``C = c B_c / (c - a (1 - B_c))``.

    Args:
        servers: ``c`` (integer >= 1).
        offered_load: ``a = lambda * S`` in Erlangs, ``0 <= a < c``.

    Returns:
        A probability in [0, 1).

    Raises:
        ValueError: if ``a >= c`` (unstable).

    References:
        Harchol-Balter 2013, Chapter 14 (M/M/k, Erlang C).
    """
    c = _checks.count("servers", servers)
    a = _checks.positive("offered_load", offered_load, allow_zero=True)
    if a >= c:
        raise ValueError(f"offered_load ({a:g}) must be below servers ({c}): otherwise the "
                         f"queue grows without bound. Add servers or lower the load.")
    blocking = 1.0
    for k in range(1, c + 1):
        blocking = a * blocking / (k + a * blocking)
    return c * blocking / (c - a * (1 - blocking))


def mmc_mean_wait_s(arrival_rate_per_s: float, service_s: float, servers: int) -> float:
    """Mean time in the queue of an M/M/c queue: ``C(c, a) * S / (c - a)``, ``a = lambda S``.

    Args:
        arrival_rate_per_s: Poisson arrival rate (>= 0).
        service_s: mean (exponential) service time (> 0).
        servers: ``c`` (integer >= 1); for a decode replica, the sequences that fit.

    Returns:
        Seconds.

    Raises:
        ValueError: if ``lambda S >= c`` (unstable).

    References:
        Harchol-Balter 2013, Chapter 14.
    """
    _utilisation(arrival_rate_per_s, service_s, servers)
    load = arrival_rate_per_s * service_s
    return erlang_c(servers, load) * service_s / (servers - load)


def decode_batch_for_rate(requests_per_s: float, output_tokens: int,
                          tpot_s: Callable[[int], float], max_batch: int) -> int:
    """The batch a decode replica settles at when requests arrive at ``requests_per_s``.

    By Little's law a request stays ``output_tokens * tpot_s(b)`` seconds, so the batch ``b``
    must satisfy ``b >= requests_per_s * output_tokens * tpot_s(b)``. This returns the smallest
    integer ``b`` that does: the mean batch, rounded up. It assumes the replica's throughput
    ``b / tpot_s(b)`` grows with ``b`` (true on the decode roofline), which makes the condition
    monotone, so a bisection finds it.

    Args:
        requests_per_s: arrival rate (> 0).
        output_tokens: tokens generated per request (integer >= 1).
        tpot_s: time per output token as a function of the batch, e.g.
            ``lambda b: serving.decode_step(model, b, s, gpu=..., tp=...).time_s``.
        max_batch: the most sequences that fit in memory (integer >= 1).

    Returns:
        The batch, ``1 <= b <= max_batch``.

    Raises:
        ValueError: if even ``max_batch`` cannot keep up; the message gives the capacity.

    References:
        Little 1961.
    """
    rate = _checks.positive("requests_per_s", requests_per_s)
    tokens = _checks.count("output_tokens", output_tokens)
    top = _checks.count("max_batch", max_batch)

    def keeps_up(b: int) -> bool:
        return b >= rate * tokens * tpot_s(b)

    if not keeps_up(top):
        capacity = top / (tokens * tpot_s(top))
        raise ValueError(f"{rate:g} requests/s exceed the replica's capacity of {capacity:.4g} "
                         f"requests/s ({top} sequences of {tokens} tokens at "
                         f"{tpot_s(top) * 1e3:.1f} ms per token): add replicas.")
    low, high = 1, top  # keeps_up(high) holds; find the smallest batch that does
    while low < high:
        mid = (low + high) // 2
        if keeps_up(mid):
            high = mid
        else:
            low = mid + 1
    return low
