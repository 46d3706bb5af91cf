"""A flow-level model of collectives on a cluster fabric: contention, routing, placement.

:func:`clusterlab.analytic.costmodel.cluster_collective` assumes that every flow has its links to
itself. This module drops that assumption. A collective becomes a chain of *steps*; each step is a
set of concurrent *flows* (GPU ``a`` sends ``b`` bytes to GPU ``d``) over a
:mod:`clusterlab.analytic.topology` graph:

* **Routing** (:data:`POLICIES`): a flow inside a server crosses its NVSwitch; between servers
  it climbs from its GPU's leaf switch to the lowest tier that reaches the destination's leaf,
  choosing among the equal-cost next hops at each switch by

  - ``"ecmp"``: a hash of (seed, switch, source, destination, queue pair), as switches hash a
    packet's 5-tuple; a connection split over ``qps`` queue pairs becomes ``qps`` sub-flows
    with different source ports, hashed independently, each carrying ``1/qps`` of the bytes;
  - ``"dmodk"``: static destination-mod-k routing (up-port ``(d // m) mod k`` at each up-hop,
    ``m`` the product of the choices below), the classic deterministic fat-tree routing;
  - ``"spray"``: ideal packet spraying, every flow split evenly over every equal-cost next hop
    (the best any load balancer can do in a symmetric Clos).

  With ``pxn=True`` a flow to a GPU on another server and another rail first crosses the
  NVSwitch to the GPU of the source server on the destination's rail and leaves through that
  GPU's NIC (NCCL's PXN), so it stays on one rail.
* **Rates** are max-min fair (progressive filling over the directed links, vectorised with
  ``scipy.sparse``): the fluid model of TCP-like / DCQCN-like congestion control that flow-level
  simulators such as SimGrid use. When a flow ends its bandwidth is shared again among the
  rest (event-driven), so a step lasts until its slowest flow ends, plus that flow's path
  latency (the sum of its links' latencies).
* **Steps chain**: a ring all-reduce on ``n`` GPUs is ``2(n-1)`` identical steps of
  ``nbytes/n`` per GPU (split over ``channels`` rings), so one step is solved and multiplied;
  a hierarchical all-reduce is three phases (reduce-scatter in the server, all-reduce along the
  rails, all-gather in the server); an all-to-all is one step of all pairs. A tree all-reduce
  is NCCL's double binary tree (:func:`double_binary_tree`) across servers with a chain over
  NVLink inside each, pipelined in chunks: in its steady state every tree edge carries the
  reduction up and the broadcast down at once, so it is one step of all those flows, plus
  the pipeline's fill as latency (see :func:`steps`).
* **For the planner**, :func:`contention_factor` divides a data-parallel all-reduce's time
  by its time with an unlimited fabric core (only NICs and NVLink limit it, as
  :func:`clusterlab.analytic.costmodel.cluster_collective` assumes);
  ``clusterlab.analytic.plan.Assumptions`` takes it as ``dp_contention_factor``.

Links run at line rate times their own efficiencies (``costmodel.NVLINK_EFFICIENCY`` for
NVLink: NCCL's 20.6 of 25 GB/s per NVLink4 link; ``costmodel.NIC_EFFICIENCY`` for network
links: the 48 of 50 GB/s at which NCCL's search runs a 400 Gb/s NIC's channel).
:func:`clusterlab.analytic.costmodel.cluster_collective` is NCCL's own tuning model
(``costmodel.NCCL_RELEASE``), whose bandwidths are channels times the speed steps that NCCL's
topology search finds, so without contention the two agree ring against ring (NCCL forced to
ring): exactly when the NICs bound the ring, and within 4% on one server (NCCL's 12 channels of
30 GB/s against 370.8):
``tests/test_fabric.py`` asserts each ratio.

What the model cannot show: it has no buffers, no PFC pauses, no head-of-line blocking and no
packet loss, so under incast (many senders into one port) it is optimistic; packet-level
simulators (htsim, ns-3, ASTRA-sim's network backends) model those.

References:
    D. Bertsekas, R. Gallager, *Data Networks*, 2nd ed., section 6.5.2 (max-min fairness,
    progressive filling), 1992.
    A. Gangidi et al., "RDMA over Ethernet for Distributed AI Training at Meta Scale",
    SIGCOMM 2024. https://doi.org/10.1145/3651890.3672233
    E. Zahavi, "D-Mod-K Routing Providing Non-Blocking Traffic for Shift Permutations on Real
    Life Fat Trees", CCIT Report 776, Technion, 2010.
    P. Velho, L. Schnorr, H. Casanova, A. Legrand, "On the validity of flow-level TCP network
    models for grid and cloud simulations", ACM TOMACS 23(4), 2013 (SimGrid's flow model).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path
from tqdm import tqdm

from clusterlab import _checks
from clusterlab.analytic import costmodel, topology

Policy = Literal["ecmp", "dmodk", "spray"]
Op = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
Algorithm = Literal["ring", "hierarchical", "tree", "pairwise"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
OPS: tuple[Op, ...] = get_args(Op)
ALGORITHMS = {"all_reduce": ("ring", "hierarchical", "tree"), "all_gather": ("ring",),
              "reduce_scatter": ("ring",), "all_to_all": ("pairwise",)}
#: Default latency of one network link (NIC or switch hop) and of one NVLink hop, seconds.
#: Illustrative orders of magnitude, not fitted: they matter only for small messages.
NET_HOP_LATENCY_S = 1e-6
NVLINK_HOP_LATENCY_S = 0.5e-6
#: One-way delay of light in optical fibre, seconds per metre: glass slows it to about c/1.5
#: (the 5 ns/m Cisco's PFC white paper uses for the cable's share of the headroom).
FIBER_DELAY_S_PER_M = 5e-9
_SWITCH_KINDS = ("leaf", "spine", "core")


def _mix(*keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of integer arrays (splitmix64 finaliser over a running combination)."""
    with np.errstate(over="ignore"):
        h = np.zeros(np.broadcast(*keys).shape, dtype=np.uint64)
        for key in keys:
            h = (h ^ np.asarray(key).astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(30)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(27)
            h *= np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(31)
    return h


class _SubFlows(NamedTuple):
    """The sub-flows of a route: each one's source, destination, connection and queue pair."""

    src: np.ndarray
    dst: np.ndarray
    conn: np.ndarray
    qp: np.ndarray


class _Entries:
    """The (link, sub-flow, fraction) entries of an incidence matrix, collected per hop."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []   # link index per entry
        self._cols: list[np.ndarray] = []   # sub-flow per entry
        self._vals: list[np.ndarray] = []

    def add(self, arcs: np.ndarray, subs: np.ndarray, weight: np.ndarray | None = None) -> None:
        """Sub-flow ``subs[i]`` crosses link ``arcs[i]`` (all of it, or ``weight[i]`` of it)."""
        self._rows.append(arcs)
        self._cols.append(subs)
        self._vals.append(np.ones(len(arcs)) if weight is None else weight)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Links, sub-flows and fractions, concatenated in the order they were added."""
        return tuple(np.concatenate(x) for x in (self._rows, self._cols, self._vals))


class Fabric:
    """A :mod:`clusterlab.analytic.topology` graph compiled for flow-level simulation.

    Every undirected edge becomes two directed links ("arcs"), each with the edge's
    ``bytes_per_s`` times an efficiency (links are full duplex) and a latency.

    Args:
        graph: a topology following :mod:`clusterlab.analytic.topology`'s conventions. Each endpoint
            must have exactly one network (leaf) neighbour and at most one NVSwitch.
        nic_efficiency: fraction of line rate a network link delivers (default: the course's
            ``costmodel.NIC_EFFICIENCY``, one NDR NIC's published nccl-tests busbw over 50 GB/s).
        nvlink_efficiency: the same for NVLink (default ``costmodel.NVLINK_EFFICIENCY``).
        net_hop_latency_s: latency of one network link.
        nvlink_hop_latency_s: latency of one NVLink hop (GPU to NVSwitch or back).

    Raises:
        ValueError: for a graph without endpoints, an endpoint with no or several leaves, an
            efficiency outside (0, 1] or a negative latency.
    """

    def __init__(self, graph: nx.Graph, *, nic_efficiency: float = costmodel.NIC_EFFICIENCY,
                 nvlink_efficiency: float = costmodel.NVLINK_EFFICIENCY,
                 net_hop_latency_s: float = NET_HOP_LATENCY_S,
                 nvlink_hop_latency_s: float = NVLINK_HOP_LATENCY_S):
        if not isinstance(graph, nx.Graph):
            raise ValueError(f"graph must be a networkx graph from clusterlab.analytic.topology, got "
                             f"{type(graph).__name__}.")
        for name, value in (("nic_efficiency", nic_efficiency),
                            ("nvlink_efficiency", nvlink_efficiency)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}.")
        for name, value in (("net_hop_latency_s", net_hop_latency_s),
                            ("nvlink_hop_latency_s", nvlink_hop_latency_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {value!r}.")
        self.graph = graph
        self.gpus = topology.endpoints(graph)
        self.names = list(graph.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        kinds = dict(graph.nodes(data="kind"))
        n_nodes = len(self.names)
        # Directed arcs: both directions of every edge.
        tail, head, cap, lat = [], [], [], []
        for u, v, rate in graph.edges(data="bytes_per_s"):
            if rate is None or rate <= 0:
                raise ValueError(f"Edge {u!r}-{v!r} needs a positive 'bytes_per_s'.")
            nvlink = "nvswitch" in (kinds.get(u), kinds.get(v))
            eff = nvlink_efficiency if nvlink else nic_efficiency
            hop = nvlink_hop_latency_s if nvlink else net_hop_latency_s
            for a, b in ((u, v), (v, u)):
                tail.append(self.index[a])
                head.append(self.index[b])
                cap.append(rate * eff)
                lat.append(hop)
        self.tail, self.head = np.array(tail), np.array(head)
        self.capacity_bytes_per_s = np.array(cap, dtype=float)
        self.latency_s = np.array(lat, dtype=float)
        self.n_arcs = len(cap)
        self._arc = sp.csr_matrix((np.arange(1, self.n_arcs + 1), (self.tail, self.head)),
                                  shape=(n_nodes, n_nodes))
        # Endpoints: their leaf, NVSwitch, server and rail.
        n_gpus = len(self.gpus)
        self._gpu_node = np.array([self.index[g] for g in self.gpus], dtype=int)
        self.leaf = np.full(n_gpus, -1)
        self.nvswitch = np.full(n_gpus, -1)
        self.server = np.full(n_gpus, -1)
        self.rail = np.full(n_gpus, -1)
        for g, name in enumerate(self.gpus):
            leaves = [m for m in graph[name] if kinds.get(m) in _SWITCH_KINDS]
            if len(leaves) != 1:
                raise ValueError(f"Endpoint {name!r} has {len(leaves)} network switches as "
                                 f"neighbours; this model needs exactly one (its leaf).")
            self.leaf[g] = self.index[leaves[0]]
            nvs = [m for m in graph[name] if kinds.get(m) == "nvswitch"]
            if nvs:
                self.nvswitch[g] = self.index[nvs[0]]
            attrs = graph.nodes[name]
            self.server[g] = attrs.get("node", -1)
            self.rail[g] = attrs.get("local_rank", -1)
        # GPU of (server, rail), for PXN.
        self._by_server_rail = {(int(s), int(r)): g for g, (s, r)
                                in enumerate(zip(self.server, self.rail)) if s >= 0}
        # Distances between switches, over switch-to-switch links only.
        self.switches = np.array([self.index[n] for n in self.names
                                  if kinds.get(n) in _SWITCH_KINDS])
        self._switch_pos = np.full(n_nodes, -1)
        self._switch_pos[self.switches] = np.arange(len(self.switches))
        keep = (self._switch_pos[self.tail] >= 0) & (self._switch_pos[self.head] >= 0)
        n_sw = len(self.switches)
        adjacency = sp.csr_matrix((np.ones(keep.sum()), (self._switch_pos[self.tail[keep]],
                                                         self._switch_pos[self.head[keep]])),
                                  shape=(n_sw, n_sw))
        self._sw_adjacency = adjacency
        leaves = np.unique(self.leaf)
        self._leaf_row = np.full(n_nodes, -1)
        self._leaf_row[leaves] = np.arange(len(leaves))
        self._dist = shortest_path(adjacency, unweighted=True, directed=False,
                                   indices=self._switch_pos[leaves])  # leaves x switches
        self._next_cache: dict[tuple[int, int], np.ndarray] = {}
        self._spray_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    # ---------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"Fabric({self.graph.graph.get('name', 'graph')!r}: {len(self.gpus)} GPUs, "
                f"{self.n_arcs} directed links)")

    def core_free_capacity(self) -> np.ndarray:
        """Link capacities with every switch-to-switch link unlimited (``inf``).

        Only the endpoints' own links (GPU to leaf and back, NVLink) keep their capacity:
        the contention-free fabric that :func:`contention_factor` compares with.
        """
        cap = self.capacity_bytes_per_s.copy()
        core = (self._switch_pos[self.tail] >= 0) & (self._switch_pos[self.head] >= 0)
        cap[core] = np.inf
        return cap

    def arcs(self, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
        """Indices of the directed links ``tails[i] -> heads[i]`` (node indices)."""
        tails, heads = np.asarray(tails, dtype=int), np.asarray(heads, dtype=int)
        if not len(tails):
            return np.zeros(0, dtype=int)
        found = np.asarray(self._arc[tails, heads]).ravel().astype(int) - 1
        if (found < 0).any():
            i = int(np.argmax(found < 0))
            raise ValueError(f"No link {self.names[int(tails[i])]!r} -> "
                             f"{self.names[int(heads[i])]!r} in the graph.")
        return found

    def _next_hops(self, switch: int, leaf: int) -> np.ndarray:
        """Switch nodes one hop closer to ``leaf`` than ``switch`` (sorted by node index)."""
        key = (switch, leaf)
        hops = self._next_cache.get(key)
        if hops is None:
            row = self._dist[self._leaf_row[leaf]]
            pos = self._switch_pos[switch]
            if not np.isfinite(row[pos]):
                raise ValueError(f"No path from {self.names[switch]!r} to "
                                 f"{self.names[leaf]!r}: the fabric is disconnected.")
            a = self._sw_adjacency
            nbrs = a.indices[a.indptr[pos]:a.indptr[pos + 1]]
            hops = np.sort(self.switches[nbrs[row[nbrs] == row[pos] - 1]])
            self._next_cache[key] = hops
        return hops

    def _spray(self, src_leaf: int, dst_leaf: int) -> tuple[np.ndarray, np.ndarray]:
        """Links and fractions of a flow sprayed evenly over all shortest switch paths."""
        key = (src_leaf, dst_leaf)
        if key not in self._spray_cache:
            weights: dict[int, float] = {}
            level = {src_leaf: 1.0}
            while dst_leaf not in level:
                nxt: dict[int, float] = {}
                for s, w in level.items():
                    hops = self._next_hops(s, dst_leaf)
                    arcs = self.arcs(np.full(len(hops), s), hops)
                    for t, arc in zip(hops, arcs):
                        weights[int(arc)] = weights.get(int(arc), 0.0) + w / len(hops)
                        nxt[int(t)] = nxt.get(int(t), 0.0) + w / len(hops)
                level = nxt
            self._spray_cache[key] = (np.array(list(weights), dtype=int),
                                      np.array(list(weights.values())))
        return self._spray_cache[key]

    # ---------------------------------------------------------------------------------------
    def route(self, src: np.ndarray, dst: np.ndarray, *, policy: Policy = "ecmp", seed: int = 0,
              qps: int = 1, pxn: bool = False, conn: np.ndarray | None = None
              ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """Route flows ``src[i] -> dst[i]`` (endpoint positions) as sub-flows over the links.

        Args:
            src, dst: endpoint positions (in :attr:`gpus` order), one pair per flow.
            policy: one of :data:`POLICIES`.
            seed: the ECMP hash seed.
            qps: queue pairs per connection; each becomes a sub-flow (ECMP hashes each).
            pxn: forward cross-rail flows over NVLink to the source server's GPU on the
                destination's rail (needs NVSwitches and rail attributes).
            conn: a connection id per flow, hashed with it (e.g. the channel), default 0.

        Returns:
            ``(incidence, flow_of, latency_s)``: a links x sub-flows sparse matrix of the
            fraction of each sub-flow on each link, the flow of each sub-flow, and each
            sub-flow's path latency (for a sprayed flow, the fraction-weighted sum of its
            links' latencies: one path's latency).
        """
        if policy not in POLICIES:
            raise ValueError(f"Unknown routing policy {policy!r}; use one of "
                             f"{', '.join(POLICIES)}.")
        if isinstance(qps, bool) or not isinstance(qps, int) or qps < 1:
            raise ValueError(f"qps (queue pairs per connection) must be an integer >= 1, "
                             f"got {qps!r}.")
        src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
        if (src == dst).any():
            raise ValueError("A flow from a GPU to itself has no links; drop it.")
        n_flows = len(src)
        conn = np.zeros(n_flows, dtype=int) if conn is None else np.asarray(conn, dtype=int)
        sub_qps = qps if policy == "ecmp" else 1
        flow_of = np.repeat(np.arange(n_flows), sub_qps)
        subflows = _SubFlows(src=src[flow_of], dst=dst[flow_of], conn=conn[flow_of],
                             qp=np.tile(np.arange(sub_qps), n_flows))
        s, d = subflows.src, subflows.dst
        entries = _Entries()
        same_server = (self.server[s] >= 0) & (self.server[s] == self.server[d]) & \
            (self.nvswitch[s] >= 0)
        # 1. Inside a server: GPU -> NVSwitch -> GPU.
        idx = np.flatnonzero(same_server)
        entries.add(self.arcs(self._node(s[idx]), self.nvswitch[s[idx]]), idx)
        entries.add(self.arcs(self.nvswitch[s[idx]], self._node(d[idx])), idx)
        # 2. PXN: to the source server's GPU on the destination's rail first.
        net = np.flatnonzero(~same_server)
        origin = self._pxn_hop(s, d, net, entries) if pxn else s[net].copy()
        # 3. The network: GPU -> leaf -> ... -> leaf -> GPU.
        entries.add(self.arcs(self._node(origin), self.leaf[origin]), net)
        entries.add(self.arcs(self.leaf[d[net]], self._node(d[net])), net)
        if policy == "spray":
            self._spray_switches(self.leaf[origin], self.leaf[d[net]], net, entries)
        else:
            self._hop_by_hop(self.leaf[origin], self.leaf[d[net]], net, subflows, entries,
                             policy=policy, seed=seed)
        row, col, val = entries.arrays()
        n_sub = len(flow_of)
        incidence = sp.csr_matrix((val, (row, col)), shape=(self.n_arcs, n_sub))
        latency = np.zeros(n_sub)
        # A sprayed flow's fractions at each hop sum to 1: weighting by them gives its path's
        # latency (equal-cost paths have equal hop counts), not the sum over every path.
        np.add.at(latency, col, self.latency_s[row] * val)
        return incidence, flow_of, latency

    def _pxn_hop(self, s: np.ndarray, d: np.ndarray, net: np.ndarray,
                 entries: _Entries) -> np.ndarray:
        """PXN's NVLink hop for the cross-rail sub-flows ``net``; where each enters the network.

        A cross-rail sub-flow goes first over NVLink to the GPU of its source's server on its
        destination's rail; the others enter the network at their own GPU.
        """
        origin = s[net].copy()
        cross = (self.rail[s[net]] != self.rail[d[net]]) & (self.nvswitch[s[net]] >= 0) & \
            (self.rail[d[net]] >= 0)
        for k in np.flatnonzero(cross):
            key = (int(self.server[s[net[k]]]), int(self.rail[d[net[k]]]))
            if key not in self._by_server_rail:
                raise ValueError(f"PXN needs a GPU on rail {key[1]} in server {key[0]}.")
            origin[k] = self._by_server_rail[key]
        hop = net[cross]
        entries.add(self.arcs(self._node(s[hop]), self.nvswitch[s[hop]]), hop)
        entries.add(self.arcs(self.nvswitch[s[hop]], self._node(origin[cross])), hop)
        return origin

    def _spray_switches(self, cur: np.ndarray, target: np.ndarray, net: np.ndarray,
                        entries: _Entries) -> None:
        """Leaf to leaf, each sub-flow spread evenly over every shortest path."""
        for k in np.flatnonzero(cur != target):
            arcs, weight = self._spray(int(cur[k]), int(target[k]))
            entries.add(arcs, np.full(len(arcs), net[k]), weight)

    def _hop_by_hop(self, cur: np.ndarray, target: np.ndarray, subs: np.ndarray,
                    subflows: _SubFlows, entries: _Entries, *, policy: Policy,
                    seed: int) -> None:
        """Leaf to leaf, one next hop per sub-flow and switch: ECMP's hash or D-mod-k's digit."""
        s, d = subflows.src, subflows.dst
        up_product = np.ones(len(subs), dtype=np.int64)
        while True:
            moving = cur != target
            if not moving.any():
                return
            cur, target, subs, up_product = (cur[moving], target[moving], subs[moving],
                                             up_product[moving])
            table, n_choices = self._next_hop_table(cur, target)
            if policy == "ecmp":
                h = _mix(np.full(len(subs), seed), cur, s[subs], d[subs], subflows.qp[subs],
                         subflows.conn[subs])
                pick = (h % n_choices.astype(np.uint64)).astype(np.int64)
            else:  # dmodk: destination-based, one digit per up-hop with a choice
                pick = (d[subs] // up_product) % n_choices
                up_product = up_product * n_choices
            nxt = table[np.arange(len(cur)), pick]
            entries.add(self.arcs(cur, nxt), subs)
            cur = nxt

    def _next_hop_table(self, cur: np.ndarray, target: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's next hops (row i, padded with -1) and how many there are."""
        n_nodes = len(self.names)
        keys, inverse = np.unique(cur * n_nodes + target, return_inverse=True)
        tables = [self._next_hops(int(k // n_nodes), int(k % n_nodes)) for k in keys]
        width = max(len(t) for t in tables)
        table = np.full((len(keys), width), -1)
        count = np.empty(len(keys), dtype=np.int64)
        for i, t in enumerate(tables):
            table[i, :len(t)] = t
            count[i] = len(t)
        return table[inverse], count[inverse]

    def _node(self, gpu_positions: np.ndarray) -> np.ndarray:
        return self._gpu_node[np.asarray(gpu_positions, dtype=int)]


# -------------------------------------------------------------------------------------------
# Max-min fair rates and the time of one step
# -------------------------------------------------------------------------------------------

def max_min_rates(incidence: sp.spmatrix, capacity_bytes_per_s: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows on links, by progressive filling.

    All unfrozen flows grow at the same pace; when a link fills, the flows crossing it freeze
    at their current rate; repeat until every flow is frozen. A flow crossing a link with
    fraction ``w`` (sprayed flows) loads it with ``w`` times its rate.

    Args:
        incidence: links x flows, the fraction of each flow on each link (>= 0).
        capacity_bytes_per_s: capacity of each link; ``inf`` for a link that never limits.

    Returns:
        Each flow's rate in bytes/s.

    Raises:
        ValueError: a flow that crosses no link (its rate would be unbounded).
    """
    a = sp.csr_matrix(incidence)
    cap = np.asarray(capacity_bytes_per_s, dtype=float)
    if a.shape[0] != len(cap):
        raise ValueError(f"incidence has {a.shape[0]} links but {len(cap)} capacities.")
    at = a.T.tocsr()
    n_flows = a.shape[1]
    if n_flows and (np.diff(at.indptr) == 0).any():
        raise ValueError("A flow crosses no link; its rate would be unbounded.")
    rate = np.zeros(n_flows)
    active = np.ones(n_flows, dtype=bool)
    residual = cap.copy()
    finite = np.isfinite(cap)         # unlimited links (inf) never fill
    while active.any():
        load = a @ active.astype(float)
        used = (load > 0) & finite
        if not used.any():
            raise ValueError("Flows cross only unlimited (inf) links; their rates would be "
                             "unbounded. Give some link on their path a finite capacity.")
        delta = np.min(residual[used] / load[used])
        rate[active] += delta
        residual[finite] -= load[finite] * delta
        full = used & (residual <= 1e-9 * cap)
        frozen = (at @ full.astype(float)) > 0
        active &= ~frozen
    return rate


def step_seconds(incidence: sp.spmatrix, capacity_bytes_per_s: np.ndarray,
                 nbytes: np.ndarray, latency_s: np.ndarray | None = None) -> float:
    """Time for concurrent flows to move ``nbytes[i]`` each, max-min fair, re-shared as flows end.

    Flows start together; rates are max-min fair (:func:`max_min_rates`) and are computed
    again whenever flows end (the fluid model of flow-level simulators). The step lasts until
    the last flow ends, plus the longest path latency among the flows.

    When every flow carries the same bytes ``S`` the answer has a closed form, used here:
    ``S / r1`` with ``r1 = min over links of capacity / (sum of the fractions crossing it)``,
    the first level of progressive filling. The flows on that link all run at ``r1`` until
    they end together, and no flow ever runs slower, because removing flows can only raise
    every link's ``capacity / load``. ``tests/test_fabric.py`` checks it against the
    event-driven loop used for unequal sizes.

    Args:
        incidence: links x flows, the fraction of each flow on each link.
        capacity_bytes_per_s: capacity of each link.
        nbytes: bytes of each flow (> 0).
        latency_s: path latency of each flow (default 0).

    Returns:
        Seconds.
    """
    a = sp.csc_matrix(incidence)
    size = np.asarray(nbytes, dtype=float)
    if len(size) != a.shape[1]:
        raise ValueError(f"{a.shape[1]} flows but {len(size)} sizes.")
    if not len(size):
        return 0.0
    if (size <= 0).any():
        raise ValueError("Every flow needs a positive number of bytes; drop empty flows.")
    cap = np.asarray(capacity_bytes_per_s, dtype=float)
    latency = 0.0 if latency_s is None else float(np.max(latency_s))
    if np.ptp(size) <= 1e-12 * size.max():
        load = a @ np.ones(a.shape[1])
        used = load > 0
        if (np.diff(a.indptr) == 0).any():
            raise ValueError("A flow crosses no link; its rate would be unbounded.")
        return float(size[0] * np.max(load[used] / cap[used])) + latency
    return fluid_seconds(a, cap, size) + latency


def fluid_seconds(incidence: sp.spmatrix, capacity_bytes_per_s: np.ndarray,
                  nbytes: np.ndarray) -> float:
    """Seconds until the last of the flows ends, event by event (no closed form, no latency).

    Max-min fair rates (:func:`max_min_rates`) are computed, time runs to the next flow's
    end, that flow leaves, and the rates are computed again, until no flow is left.
    """
    a = sp.csc_matrix(incidence)
    cap = np.asarray(capacity_bytes_per_s, dtype=float)
    size = np.asarray(nbytes, dtype=float)
    remaining = size.copy()
    alive = np.arange(len(size))
    now = 0.0
    while len(alive):
        rate = max_min_rates(a[:, alive], cap)
        dt = np.min(remaining[alive] / rate)
        now += dt
        remaining[alive] -= rate * dt
        alive = alive[remaining[alive] > 1e-9 * size[alive]]
    return now


# -------------------------------------------------------------------------------------------
# Collectives
# -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FabricTime:
    """The flow model's time for one collective.

    Attributes:
        op, algorithm: what ran.
        nbytes: buffer per GPU, as nccl-tests counts it.
        n_gpus: GPUs in each group.
        time_s: total seconds (``transfer_s + latency_s``).
        transfer_s: seconds the steps spend moving bytes (max-min fair, slowest flow).
        latency_s: seconds of path latency (the slowest flow's path, per step).
        steps: number of steps.
        busbw: ``nbytes / time_s * costmodel.busbw_factor(op, n_gpus)``, bytes/s.
    """

    op: str
    algorithm: str
    nbytes: float
    n_gpus: int
    time_s: float
    transfer_s: float
    latency_s: float
    steps: int
    busbw: float


def _groups(fabric: Fabric, ranks, groups) -> list[np.ndarray]:
    if ranks is not None and groups is not None:
        raise ValueError("Give ranks (one group) or groups (several concurrent), not both.")
    if groups is None:
        groups = [range(len(fabric.gpus)) if ranks is None else ranks]
    out = []
    for g in groups:
        g = np.asarray(list(g), dtype=int)
        if len(g) < 2:
            raise ValueError(f"A collective needs at least 2 GPUs in each group, got {len(g)}.")
        if g.min() < 0 or g.max() >= len(fabric.gpus):
            raise ValueError(f"Ranks are endpoint positions 0..{len(fabric.gpus) - 1}; got "
                             f"{g.min()}..{g.max()}.")
        if len(np.unique(g)) != len(g):
            raise ValueError("A group lists a GPU twice.")
        out.append(g)
    if len({len(g) for g in out}) != 1:
        raise ValueError("All concurrent groups must have the same number of GPUs.")
    every = np.concatenate(out)
    if len(np.unique(every)) != len(every):
        raise ValueError("Concurrent groups must not share GPUs.")
    return out


def ring_order(fabric: Fabric, ranks: Sequence[int], channel: int = 0, *,
               aware: bool = True) -> np.ndarray:
    """The order of one ring (one NCCL channel) over ``ranks``.

    Topology-aware (``aware=True``): GPUs grouped by server in order of first appearance; in
    each server the ring starts at local rank ``channel`` and walks the rails, every other
    server walking them backwards, so the hop between servers joins two GPUs on the same rail
    (rail-aligned: it stays on one rail switch when the servers share it). Otherwise the ring
    follows ``ranks`` as given (what a placement-blind ring does).
    """
    ranks = np.asarray(ranks, dtype=int)
    if not aware or (fabric.server[ranks] < 0).any():
        return ranks
    servers: dict[int, list[int]] = {}
    for r in ranks:
        servers.setdefault(int(fabric.server[r]), []).append(int(r))
    order = []
    for i, members in enumerate(servers.values()):
        members = sorted(members, key=lambda g: fabric.rail[g])
        k = channel % len(members)
        members = members[k:] + members[:k]
        order.extend(members if i % 2 == 0 else members[::-1])
    return np.array(order, dtype=int)


class Step(NamedTuple):
    """One step of a collective: concurrent flows, repeated ``repeats`` times in a chain.

    Attributes:
        src, dst: endpoint positions of each flow (int arrays of the same length).
        conn: a connection id of each flow (its channel), hashed by ECMP.
        nbytes: bytes of each flow.
        repeats: how many identical steps follow one another.
    """

    src: np.ndarray
    dst: np.ndarray
    conn: np.ndarray
    nbytes: np.ndarray
    repeats: int
    latency_steps: int | None = None
    """Path latencies charged for the step (default ``repeats``); a pipelined tree charges its
    fill, ``2 (depth + g - 1)`` hops, for one step of bytes."""


def double_binary_tree(n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's double binary tree over ``n`` nodes: the parent of each node in each tree.

    The first tree is the binary tree of NCCL's ``ncclGetBtree`` (``src/graph/trees.cc``):
    root 0; a node ``r > 0`` with lowest set bit ``b`` has parent ``(r ^ b) | (b << 1)``, or
    ``r ^ b`` when that is ``>= n``; so odd nodes are leaves. The second tree is the first
    mirrored (node ``r`` sits where ``n - 1 - r`` sits in the first) when ``n`` is even, or
    shifted by one (where ``r - 1`` sits) when ``n`` is odd, so that a node inside one tree is
    a leaf in the other and each tree carries half the data (``ncclGetDtree``).

    Args:
        n_devices: nodes (>= 1).

    Returns:
        ``(parent0, parent1)``: int arrays of length ``n``, ``-1`` at each tree's root.

    Reference:
        S. Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA
        blog, 2019; NVIDIA NCCL ``src/graph/trees.cc``.
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, (int, np.integer)) or n_devices < 1:
        raise ValueError(f"A tree needs a whole number of nodes >= 1, got {n_devices!r}.")
    first = np.full(n_devices, -1)
    for r in range(1, n_devices):
        low = r & -r
        up = (r ^ low) | (low << 1)
        first[r] = up if up < n_devices else r ^ low
    # Second tree: node r takes the place of node pos(r) of the first tree.
    pos = (n_devices - 1 - np.arange(n_devices)) if n_devices % 2 == 0 else (np.arange(n_devices) - 1) % n_devices
    node_at = np.empty(n_devices, dtype=int)
    node_at[pos] = np.arange(n_devices)
    parent_pos = first[pos]
    second = np.where(parent_pos >= 0, node_at[np.maximum(parent_pos, 0)], -1)
    return first, second


def _tree_depth(parent: np.ndarray) -> int:
    """Edges on the longest path from a node to the root."""
    depth = 0
    for r in range(len(parent)):
        d, node = 0, r
        while parent[node] >= 0:
            node, d = parent[node], d + 1
        depth = max(depth, d)
    return depth


def _tree_step(fabric, groups, channels, nbytes) -> Step:
    """The steady state of a pipelined double-binary-tree all-reduce (see :func:`steps`)."""
    src, dst, conn = [], [], []
    fill = 0
    for g in groups:
        if (fabric.server[g] >= 0).all():
            members = _members_by_server(fabric, g, "tree all-reduce")
        else:   # no servers: every GPU is a node of the tree
            members = [[int(r)] for r in g]
        n_nodes, local = len(members), len(members[0])
        trees = double_binary_tree(n_nodes)
        fill = max(fill, 2 * (max(_tree_depth(t) for t in trees) + local - 1))
        for ch in range(channels):
            k = ch % local
            chains = np.array([m[k:] + m[:k] for m in members])   # nodes x local, head first
            for t, parent in enumerate(trees):
                child = np.flatnonzero(parent >= 0)
                ups = [(chains[child, 0], chains[parent[child], 0])]          # tree edges
                ups += [(chains[:, j], chains[:, j - 1]) for j in range(1, local)]  # chains
                for a, b in ups:            # reduce towards the root, broadcast back
                    src.extend([a, b])
                    dst.extend([b, a])
                    conn.append(np.full(2 * len(a), 2 * ch + t))
    src, dst, conn = np.concatenate(src), np.concatenate(dst), np.concatenate(conn)
    return Step(src, dst, conn, np.full(len(src), nbytes / (2 * channels)), 1, fill)


def _members_by_server(fabric: Fabric, group: np.ndarray, algorithm: str) -> list[list[int]]:
    """The group's GPUs per server (servers in order of first member), each in rail order."""
    by_server: dict[int, list[int]] = {}
    for r in group:
        by_server.setdefault(int(fabric.server[r]), []).append(int(r))
    if len({len(m) for m in by_server.values()}) != 1:
        raise ValueError(f"A {algorithm} needs the same number of GPUs in every server of a "
                         f"group.")
    return [sorted(m, key=lambda x: fabric.rail[x]) for m in by_server.values()]


def _ring_step(fabric, groups, channels, aware, chunk_bytes, repeats) -> Step:
    src, dst, conn = [], [], []
    for g in groups:
        for ch in range(channels):
            order = ring_order(fabric, g, ch, aware=aware)
            src.append(order)
            dst.append(np.roll(order, -1))
            conn.append(np.full(len(order), ch))
    src, dst, conn = np.concatenate(src), np.concatenate(dst), np.concatenate(conn)
    return Step(src, dst, conn, np.full(len(src), chunk_bytes / channels), repeats)


def steps(fabric: Fabric, op: Op, nbytes: float, ranks: Sequence[int] | None = None, *,
          groups: Sequence[Sequence[int]] | None = None, algorithm: Algorithm | None = None,
          channels: int | None = None, aware: bool = True,
          load: Sequence[float] | None = None) -> list[Step]:
    """The chain of steps of a collective (arguments as in :func:`collective`).

    Returns:
        A list of :class:`Step`: a ring all-reduce is one step repeated ``2(n-1)`` times
        (``n-1`` for all-gather and reduce-scatter) with ``nbytes / n / channels`` per flow; a
        hierarchical all-reduce is the in-server ring (``2(g-1)`` steps of ``nbytes/g``) and
        the rail rings across ``N`` servers (``2(N-1)`` steps of ``nbytes/(g N)``); an
        all-to-all is one step with ``nbytes / n * load[j]`` from every member to member j.

        A tree all-reduce (NCCL's double binary tree) is one step: per channel, two trees
        (:func:`double_binary_tree` over the group's servers, or over its GPUs when the graph
        has no servers), each carrying half of the channel's ``nbytes / channels``; between
        servers an edge joins the two servers' GPUs on the channel's rail (local rank
        ``channel mod g``, the head of the server's chain); inside a server a chain over
        NVLink from the head through the other GPUs in rail order. Pipelined in small chunks,
        every edge of both trees and chains carries its half-channel up (reduce) and down
        (broadcast) at once, so the step is all of those flows of ``nbytes / (2 channels)``
        each (the fluid limit of the pipeline), and its latency is the pipeline's fill, the
        slowest path latency times ``2 (depth + g - 1)`` (up and down the deepest tree and
        chain; an upper bound, which matters only for small messages).
    """
    if op not in OPS:
        raise ValueError(f"The flow model runs {', '.join(OPS)}; got {op!r}.")
    algorithm = ALGORITHMS[op][0] if algorithm is None else algorithm
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"{op} runs as {' or '.join(ALGORITHMS[op])} here, got "
                         f"{algorithm!r}.")
    if not nbytes > 0:
        raise ValueError(f"nbytes must be a positive number of bytes, got {nbytes!r}.")
    group_list = _groups(fabric, ranks, groups)
    n = len(group_list[0])
    if channels is None:  # one channel per GPU of the fullest server
        per_server = [np.unique(fabric.server[g], return_counts=True)[1].max()
                      if (fabric.server[g] >= 0).all() else 1 for g in group_list]
        channels = int(max(per_server))
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise ValueError(f"channels must be an integer >= 1, got {channels!r}.")
    if load is not None and op != "all_to_all":
        raise ValueError("load (skewed receive traffic) applies to all_to_all only.")
    if op == "all_to_all":
        return [_all_to_all_step(group_list, nbytes, load)]
    if algorithm == "ring":
        repeats = 2 * (n - 1) if op == "all_reduce" else n - 1
        return [_ring_step(fabric, group_list, channels, aware, nbytes / n, repeats)]
    if algorithm == "tree":
        return [_tree_step(fabric, group_list, channels, nbytes)]
    return _hierarchical_steps(fabric, group_list, nbytes)


def _all_to_all_step(groups: list[np.ndarray], nbytes: float,
                     load: Sequence[float] | None) -> Step:
    """Every member to every other, ``nbytes / n * load[j]`` to member j (see :func:`steps`)."""
    n = len(groups[0])
    weights = np.ones(n) if load is None else np.asarray(load, dtype=float)
    if weights.shape != (n,) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"load needs {n} non-negative weights (one per group member).")
    weights = weights * n / weights.sum()
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    off = (i != j) & (weights[j] > 0)
    src = np.concatenate([g[i[off]] for g in groups])
    dst = np.concatenate([g[j[off]] for g in groups])
    size = np.tile(nbytes / n * weights[j[off]], len(groups))
    return Step(src, dst, np.zeros(len(src), dtype=int), size, 1)


def _hierarchical_steps(fabric: Fabric, groups: list[np.ndarray], nbytes: float) -> list[Step]:
    """The in-server rings and the rail rings across servers (see :func:`steps`)."""
    inner, outer = [], []
    for g in groups:
        if (fabric.server[g] < 0).any():
            raise ValueError("A hierarchical all-reduce needs servers (node attributes); "
                             "build the graph with topology.rail_optimized or use 'ring'.")
        members = _members_by_server(fabric, g, "hierarchical all-reduce")
        inner.extend(np.array(m) for m in members)
        outer.extend(np.array(members).T)
    g_local, n_servers = len(inner[0]), len(outer[0])
    out = []
    if g_local > 1:   # reduce-scatter, then (after the rails) all-gather, in each server
        out.append(_ring_step(fabric, inner, 1, True, nbytes / g_local, 2 * (g_local - 1)))
    if n_servers > 1:
        out.append(_ring_step(fabric, outer, 1, False, nbytes / g_local / n_servers,
                              2 * (n_servers - 1)))
    return out


def step_time(fabric: Fabric, step: Step, *, policy: Policy = "ecmp", seed: int = 0,
              qps: int = 1, pxn: bool = False,
              capacity_bytes_per_s: np.ndarray | None = None) -> tuple[float, float]:
    """Seconds of one step: ``(transfer_s, latency_s)``, routed as in :meth:`Fabric.route`.

    Each connection's bytes are split evenly over its queue pairs. ``capacity_bytes_per_s``
    replaces the links' capacities (default ``fabric.capacity_bytes_per_s``), e.g. with
    :meth:`Fabric.core_free_capacity`.
    """
    incidence, flow_of, latency = fabric.route(step.src, step.dst, conn=step.conn,
                                               policy=policy, seed=seed, qps=qps, pxn=pxn)
    per_sub = step.nbytes[flow_of] / np.bincount(flow_of)[flow_of]
    cap = fabric.capacity_bytes_per_s if capacity_bytes_per_s is None else capacity_bytes_per_s
    transfer = step_seconds(incidence, cap, per_sub)
    return transfer, float(latency.max())


def contention_factor(fabric: Fabric, nbytes: float, ranks: Sequence[int] | None = None, *,
                      groups: Sequence[Sequence[int]] | None = None, algorithm: Algorithm = "ring",
                      channels: int | None = None, aware: bool = True, policy: Policy = "ecmp",
                      seed: int = 0, qps: int = 1, pxn: bool = False) -> float:
    """How much the fabric's core slows a data-parallel all-reduce: contended / free time.

    The numerator is :func:`collective`'s time for ``all_reduce`` with these arguments (the
    job's placement ``ranks`` or ``groups``, routing, algorithm). The denominator is the same
    all-reduce, the same flows on the same routes, with every switch-to-switch link given
    unlimited capacity (:meth:`Fabric.core_free_capacity`): only the endpoints' own links
    (NICs, NVLink) limit it, which is what :func:`clusterlab.analytic.costmodel.cluster_collective`
    assumes (a non-blocking fabric, no collisions). Both include the same path latencies.

    The result is >= 1 (the all-reduce's steps have equal flows, whose time can only fall
    when capacities rise) and is what :class:`clusterlab.analytic.plan.Assumptions` takes as
    ``dp_contention_factor``: e.g. 1 for a topology-aware ring on a non-blocking fabric,
    2 for a ring whose every flow crosses 2:1 oversubscribed leaves.

    Args:
        fabric, nbytes, ranks, groups, algorithm, channels, aware, policy, seed, qps, pxn:
            as in :func:`collective` (op ``"all_reduce"``).

    Returns:
        The ratio of the two times.
    """
    chain = steps(fabric, "all_reduce", nbytes, ranks, groups=groups, algorithm=algorithm,
                  channels=channels, aware=aware)
    free = fabric.core_free_capacity()
    total = {"contended": 0.0, "free": 0.0}
    for step in chain:
        n_lat = step.repeats if step.latency_steps is None else step.latency_steps
        for key, cap in (("contended", None), ("free", free)):
            t, lat = step_time(fabric, step, policy=policy, seed=seed, qps=qps, pxn=pxn,
                               capacity_bytes_per_s=cap)
            total[key] += step.repeats * t + n_lat * lat
    return total["contended"] / total["free"]


def collective(fabric: Fabric, op: Op, nbytes: float, ranks: Sequence[int] | None = None, *,
               groups: Sequence[Sequence[int]] | None = None, algorithm: Algorithm | None = None,
               channels: int | None = None, aware: bool = True, policy: Policy = "ecmp",
               seed: int = 0, qps: int = 1, pxn: bool = False,
               load: Sequence[float] | None = None) -> FabricTime:
    """Time of one collective on the fabric, with contention, by the flow-level model.

    Args:
        fabric: the compiled :class:`Fabric`.
        op: one of :data:`OPS`.
        nbytes: the buffer per GPU in bytes, as nccl-tests' ``size`` column counts it.
        ranks: endpoint positions taking part (one group); default all endpoints.
        groups: instead of ``ranks``, several equal-sized groups running the same collective
            at the same time (e.g. every expert-parallel group of a job).
        algorithm: ``"ring"``, ``"hierarchical"`` (reduce-scatter in each server,
            all-reduce along each rail across servers, all-gather in each server) or
            ``"tree"`` (NCCL's double binary tree, see :func:`steps`) for all-reduce;
            ``"pairwise"`` for all-to-all (every pair at once). Default the first of
            :data:`ALGORITHMS` for ``op``.
        channels: rings per group, each its own connection (NCCL's channels); default the
            most GPUs a group has in one server (one per NIC), 1 without servers.
        aware: topology-aware ring order (see :func:`ring_order`), else the order given
            (rings only: a tree always joins servers in order of first appearance).
        policy, seed, qps, pxn: routing (see :meth:`Fabric.route`).
        load: all-to-all only: relative traffic each group member receives (mean 1), for
            skewed expert load; default uniform.

    Returns:
        A :class:`FabricTime`; ``time_s`` sums every step's slowest flow and path latency.
    """
    chain = steps(fabric, op, nbytes, ranks, groups=groups, algorithm=algorithm,
                  channels=channels, aware=aware, load=load)
    n = len(_groups(fabric, ranks, groups)[0])
    transfer = latency = 0.0
    for step in chain:
        t, lat = step_time(fabric, step, policy=policy, seed=seed, qps=qps, pxn=pxn)
        transfer += step.repeats * t
        latency += (step.repeats if step.latency_steps is None else step.latency_steps) * lat
    total = transfer + latency
    return FabricTime(op, algorithm or ALGORITHMS[op][0], float(nbytes), n, total, transfer,
                      latency, sum(s.repeats for s in chain),
                      nbytes / total * costmodel.busbw_factor(op, n))


def sweep(fabric: Fabric, op: Op, nbytes: float, *, over: str, values: Sequence,
          progress: bool = True, **kwargs) -> list[FabricTime]:
    """:func:`collective` once per value of one of its keyword arguments, with a progress bar.

    Args:
        fabric, op, nbytes: as in :func:`collective`.
        over: the keyword argument to vary, e.g. ``"seed"``, ``"qps"``, ``"ranks"``.
        values: its values.
        progress: show a ``tqdm`` progress bar (on stderr); ``False`` in notebooks whose
            outputs are stored.
        **kwargs: the other arguments of :func:`collective`, fixed.

    Returns:
        One :class:`FabricTime` per value, in order.

    Example:
        ``[r.time_s for r in sweep(f, "all_reduce", 2**30, over="seed", values=range(8),
        ranks=placement, aware=False)]``: the ECMP lottery of one placement.
    """
    known = ("ranks", "groups", "algorithm", "channels", "aware", "policy", "seed", "qps",
             "pxn", "load")
    if over not in known:
        raise ValueError(f"over must name an argument of collective ({', '.join(known)}), "
                         f"got {over!r}.")
    if over in kwargs:
        raise ValueError(f"{over!r} is swept; do not also fix it in the keyword arguments.")
    return [collective(fabric, op, nbytes, **{**kwargs, over: value})
            for value in tqdm(list(values), desc=f"{op} over {over}", disable=not progress)]


def pfc_headroom_bytes(link_bytes_per_s: float, cable_m: float, response_s: float,
                       mtu_bytes: float) -> float:
    """Buffer a lossless (PFC) port needs above its pause threshold so that no packet drops.

    When a receiver's queue crosses the threshold it sends a pause frame upstream; until the
    sender stops, bytes keep arriving. They are, in the worst case: the frame the receiver is
    sending when it decides (one MTU, which delays the pause), the pause's trip up the cable
    and the data's trip back (the line rate times twice the cable's delay), the sender's
    reaction time, and the frame the sender has begun and must finish (one MTU). This is
    the bandwidth-delay product of the pause loop, the sizing of Cisco's PFC white paper and
    of IEEE 802.1Qbb's headroom, with the interface delays folded into ``response_s``.

    Args:
        link_bytes_per_s: the link's line rate, bytes/s (400 Gb/s: 50e9).
        cable_m: the cable's length, metres (fibre, :data:`FIBER_DELAY_S_PER_M`).
        response_s: seconds from the pause's arrival until the sender stops sending, plus
            the ports' own processing delays.
        mtu_bytes: the largest frame on the link, bytes (e.g. 4096 B RoCE payload plus
            headers, or a 9216 B jumbo frame).

    Returns:
        The headroom in bytes, per port and per lossless priority.

    Raises:
        ValueError: a rate, length, time or frame size that is negative or not a number
            (the length and the response may be zero).

    References:
        Cisco, "Priority Flow Control: Build Reliable Layer 2 Infrastructure", white paper,
        2009 (the delay components of the headroom).
        IEEE 802.1Qbb-2011, Priority-based Flow Control. https://1.ieee802.org/dcb/802-1qbb/
    """
    rate = _checks.positive("link_bytes_per_s", link_bytes_per_s)
    length = _checks.positive("cable_m", cable_m, allow_zero=True)
    response = _checks.positive("response_s", response_s, allow_zero=True)
    frame = _checks.positive("mtu_bytes", mtu_bytes)
    in_flight = rate * (2 * length * FIBER_DELAY_S_PER_M + response)
    return in_flight + 2 * frame


def _benchmark() -> None:
    """Time one ring and one tree all-reduce at 1,024 and 16,384 GPUs
    (``python -m clusterlab.analytic.fabric``)."""
    for n_servers in (128, 2048):
        start = time.perf_counter()
        graph = topology.rail_optimized(n_servers, 8, nic_bytes_per_s=50e9, nodes_per_group=32,
                                        n_spines=32, nvlink_bytes_per_s=450e9)
        built = time.perf_counter()
        fab = Fabric(graph)
        compiled = time.perf_counter()
        aware = collective(fab, "all_reduce", 2**30)
        ring = time.perf_counter()
        shuffled = np.random.default_rng(0).permutation(len(fab.gpus))
        blind = collective(fab, "all_reduce", 2**30, shuffled, aware=False)
        done = time.perf_counter()
        tree = collective(fab, "all_reduce", 2**30, algorithm="tree")
        treed = time.perf_counter()
        print(f"{8 * n_servers:6d} GPUs: graph {built - start:.2f} s, compile "
              f"{compiled - built:.2f} s, topology-aware ring {ring - compiled:.2f} s "
              f"(busbw {aware.busbw / 1e9:.1f} GB/s), shuffled ring with ECMP "
              f"{done - ring:.2f} s (busbw {blind.busbw / 1e9:.1f} GB/s), double binary tree "
              f"{treed - done:.2f} s (busbw {tree.busbw / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    _benchmark()
