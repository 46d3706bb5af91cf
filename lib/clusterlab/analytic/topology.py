"""Cluster networks as ``networkx`` graphs: a server, fat trees (Clos), rail-optimized fabrics.

Every builder returns an undirected :class:`networkx.Graph` with these conventions:

* Each node has a ``kind`` attribute: ``"gpu"`` (an endpoint: a GPU with its own NIC, or a host
  with one NIC in a plain fat tree), ``"nvswitch"`` (the NVLink switch inside a server),
  ``"leaf"``, ``"spine"`` or ``"core"`` (network switches, bottom tier to top tier).
* Endpoints are named ``"gpu0"``, ``"gpu1"``, ... and carry an ``index`` attribute (their order:
  node by node, leaf by leaf). :func:`endpoints` returns them in that order.
* Each edge has ``bytes_per_s``: its capacity *per direction* (links are full duplex, so the same
  capacity is available the other way at the same time), and ``links``: how many physical cables
  it stands for (parallel cables between two switches are merged into one edge whose capacity is
  their sum).

Bandwidths are in bytes per second, per direction, like :mod:`clusterlab.catalog.hardware`:
a 400 Gb/s NDR port is ``hardware.link("IB-NDR").bytes_per_s == 50e9``.

The analysis functions work on any graph that follows these conventions:
:func:`bisection_bandwidth` (by max-flow/min-cut, not by formula), :func:`hop_count`,
:func:`shortest_path_count` and :func:`oversubscription`.

References:
    C. E. Leiserson, "Fat-trees: universal networks for hardware-efficient supercomputing",
    IEEE Transactions on Computers C-34(10), 1985. https://doi.org/10.1109/TC.1985.6312192
    M. Al-Fares, A. Loukissas, A. Vahdat, "A scalable, commodity data center network
    architecture", SIGCOMM 2008. https://doi.org/10.1145/1402958.1402967
    NVIDIA DGX SuperPOD reference architecture (rail-optimized compute fabric).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Sequence

import matplotlib.pyplot as plt
import networkx as nx

from clusterlab.catalog import hardware

ENDPOINT_KIND = "gpu"
# Tier of each kind of node, bottom to top; used for drawing and for oversubscription.
TIERS = {"gpu": 0, "nvswitch": 1, "leaf": 1, "spine": 2, "core": 3}


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

def _check_count(name: str, value, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


def _check_rate(name: str, value) -> None:
    try:
        ok = float(value) > 0 and float(value) != float("inf")
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a positive, finite number of bytes/s, got {value!r}.")


def _add_link(graph: nx.Graph, a: Hashable, b: Hashable, bytes_per_s: float, links: int = 1):
    """Add ``links`` parallel cables of ``bytes_per_s`` each between a and b (merged)."""
    if graph.has_edge(a, b):
        graph[a][b]["bytes_per_s"] += links * bytes_per_s
        graph[a][b]["links"] += links
    else:
        graph.add_edge(a, b, bytes_per_s=float(links * bytes_per_s), links=links)


def _add_gpu(graph: nx.Graph, index: int, **attrs) -> str:
    name = f"gpu{index}"
    graph.add_node(name, kind=ENDPOINT_KIND, index=index, **attrs)
    return name


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------

def node_graph(gpus_per_node: int = 8, nvlink_bytes_per_s: float = 450e9) -> nx.Graph:
    """One server: ``gpus_per_node`` GPUs, each linked to one (logical) NVSwitch.

    A DGX H100 has four NVSwitch chips, and each GPU spreads its 18 NVLinks over them; to the
    GPUs this behaves like one switch that gives every GPU its full NVLink bandwidth to any other
    GPU, which is the model here.

    Args:
        gpus_per_node: number of GPUs in the server.
        nvlink_bytes_per_s: NVLink bandwidth of one GPU, per direction (default: H100, NVLink4,
            ``hardware.link("NVLink4").bytes_per_s``).

    Returns:
        A graph with nodes ``gpu0..gpu{n-1}`` (kind ``"gpu"``) and ``nvswitch0`` (kind
        ``"nvswitch"``).
    """
    _check_count("gpus_per_node", gpus_per_node)
    _check_rate("nvlink_bytes_per_s", nvlink_bytes_per_s)
    graph = nx.Graph(name=f"server with {gpus_per_node} GPUs on an NVSwitch")
    graph.add_node("nvswitch0", kind="nvswitch", node=0)
    for local in range(gpus_per_node):
        gpu = _add_gpu(graph, local, node=0, local_rank=local)
        _add_link(graph, gpu, "nvswitch0", nvlink_bytes_per_s)
    return graph


def fat_tree(n_leaves: int, hosts_per_leaf: int, n_spines: int, link_bytes_per_s: float, *,
             uplink_bytes_per_s: float | None = None, links_per_spine: int = 1) -> nx.Graph:
    """A two-tier leaf-spine Clos network ("fat tree"): every leaf is cabled to every spine.

    Each leaf has ``hosts_per_leaf`` downlinks of ``link_bytes_per_s`` and
    ``n_spines * links_per_spine`` uplinks of ``uplink_bytes_per_s``. Its oversubscription is

        downlink capacity / uplink capacity
        = hosts_per_leaf * link_bytes_per_s / (n_spines * links_per_spine * uplink_bytes_per_s),

    1.0 for a non-blocking ("full bisection") fabric, 2.0 for 2:1 (see :func:`oversubscription`).

    Args:
        n_leaves: number of leaf (top-of-rack) switches.
        hosts_per_leaf: endpoints on each leaf (GPUs with their NICs, or hosts).
        n_spines: number of spine switches.
        link_bytes_per_s: rate of one endpoint-to-leaf link, per direction.
        uplink_bytes_per_s: rate of one leaf-to-spine cable, per direction (default: the same
            as ``link_bytes_per_s``).
        links_per_spine: parallel cables from each leaf to each spine.

    Returns:
        A graph with ``n_leaves * hosts_per_leaf`` endpoints ``gpu{i}`` (host i sits on leaf
        ``i // hosts_per_leaf``), leaves ``leaf{j}`` and spines ``spine{k}``.

    References:
        Leiserson (1985); Al-Fares et al. (2008), section 2.
    """
    for name, value in (("n_leaves", n_leaves), ("hosts_per_leaf", hosts_per_leaf),
                        ("n_spines", n_spines), ("links_per_spine", links_per_spine)):
        _check_count(name, value)
    _check_rate("link_bytes_per_s", link_bytes_per_s)
    uplink_bytes_per_s = link_bytes_per_s if uplink_bytes_per_s is None else uplink_bytes_per_s
    _check_rate("uplink_bytes_per_s", uplink_bytes_per_s)
    graph = nx.Graph(name=f"two-tier fat tree, {n_leaves} leaves x {hosts_per_leaf} hosts, "
                          f"{n_spines} spines")
    spines = [f"spine{k}" for k in range(n_spines)]
    graph.add_nodes_from(spines, kind="spine")
    for j in range(n_leaves):
        leaf = f"leaf{j}"
        graph.add_node(leaf, kind="leaf")
        for h in range(hosts_per_leaf):
            host = _add_gpu(graph, j * hosts_per_leaf + h, leaf=j)
            _add_link(graph, host, leaf, link_bytes_per_s)
        for spine in spines:
            _add_link(graph, leaf, spine, uplink_bytes_per_s, links_per_spine)
    return graph


def fat_tree_3tier(n_pods: int, leaves_per_pod: int, hosts_per_leaf: int, spines_per_pod: int,
                   cores_per_plane: int, link_bytes_per_s: float) -> nx.Graph:
    """A three-tier Clos: pods of leaves and spines, joined by core switches.

    Inside a pod every leaf is cabled to every spine of the pod. The cores are split into
    ``spines_per_pod`` planes of ``cores_per_plane`` switches: spine ``s`` of every pod is cabled
    to every core of plane ``s``. All cables run at ``link_bytes_per_s``. Al-Fares et al.'s
    k-ary fat tree is ``n_pods = k`` and ``leaves_per_pod = spines_per_pod = hosts_per_leaf =
    cores_per_plane = k/2``: k**3/4 hosts, non-blocking, built from k-port switches.

    Oversubscription: a leaf has ``hosts_per_leaf`` down and ``spines_per_pod`` up; a spine has
    ``leaves_per_pod`` down and ``cores_per_plane`` up.

    Args:
        n_pods: number of pods.
        leaves_per_pod: leaf switches in each pod.
        hosts_per_leaf: endpoints on each leaf.
        spines_per_pod: spine (aggregation) switches in each pod, also the number of core planes.
        cores_per_plane: core switches in each plane.
        link_bytes_per_s: rate of every cable, per direction.

    Returns:
        A graph with endpoints ``gpu{i}`` (pod by pod, leaf by leaf), ``leaf{j}``,
        ``spine{k}`` and ``core{m}`` (``n_pods * leaves_per_pod`` leaves, ``n_pods *
        spines_per_pod`` spines, ``spines_per_pod * cores_per_plane`` cores).

    References:
        Al-Fares et al. (2008), section 3.
    """
    for name, value in (("n_pods", n_pods), ("leaves_per_pod", leaves_per_pod),
                        ("hosts_per_leaf", hosts_per_leaf), ("spines_per_pod", spines_per_pod),
                        ("cores_per_plane", cores_per_plane)):
        _check_count(name, value)
    _check_rate("link_bytes_per_s", link_bytes_per_s)
    graph = nx.Graph(name=f"three-tier fat tree, {n_pods} pods")
    cores = [[f"core{s * cores_per_plane + c}" for c in range(cores_per_plane)]
             for s in range(spines_per_pod)]
    for plane in cores:
        graph.add_nodes_from(plane, kind="core")
    host = 0
    for p in range(n_pods):
        spines = [f"spine{p * spines_per_pod + s}" for s in range(spines_per_pod)]
        graph.add_nodes_from(spines, kind="spine", pod=p)
        for s, spine in enumerate(spines):
            for core in cores[s]:
                _add_link(graph, spine, core, link_bytes_per_s)
        for j in range(leaves_per_pod):
            leaf = f"leaf{p * leaves_per_pod + j}"
            graph.add_node(leaf, kind="leaf", pod=p)
            for _ in range(hosts_per_leaf):
                _add_link(graph, _add_gpu(graph, host, pod=p), leaf, link_bytes_per_s)
                host += 1
            for spine in spines:
                _add_link(graph, leaf, spine, link_bytes_per_s)
    return graph


def rail_optimized(n_nodes: int, gpus_per_node: int = 8, *, nic_bytes_per_s: float = 50e9,
                   nodes_per_group: int | None = None, n_spines: int = 1,
                   links_per_spine: int | None = None, uplink_bytes_per_s: float | None = None,
                   nvlink_bytes_per_s: float | None = None) -> nx.Graph:
    """A rail-optimized fabric: GPU i of every server sits on rail switch i.

    Servers come in groups of ``nodes_per_group`` (NVIDIA's "scalable unit"). In each group
    there is one leaf per rail: rail leaf ``r`` is cabled to the NIC of GPU ``r`` of every server
    of the group, so GPUs with the same local rank are one switch hop apart. Every rail leaf is
    cabled to every spine, which joins the rails and the groups. With ``nvlink_bytes_per_s``
    the servers' NVSwitches are included too, so traffic can also cross to another rail inside a
    server (what NCCL's PXN does).

    Args:
        n_nodes: number of servers.
        gpus_per_node: GPUs (and NICs, and rails) per server.
        nic_bytes_per_s: rate of one GPU's NIC, per direction (default 400 Gb/s NDR = 50e9).
        nodes_per_group: servers per group (default: all servers in one group);
            must divide ``n_nodes``.
        n_spines: spine switches joining all rail leaves.
        links_per_spine: parallel cables from each rail leaf to each spine (default: enough for
            a non-blocking leaf, ``ceil(nodes_per_group / n_spines)``).
        uplink_bytes_per_s: rate of one leaf-to-spine cable (default ``nic_bytes_per_s``).
        nvlink_bytes_per_s: NVLink bandwidth per GPU; ``None`` leaves NVLink out.

    Returns:
        A graph with endpoints ``gpu{node * gpus_per_node + r}`` (attributes ``node``,
        ``local_rank``), rail leaves ``su{g}.rail{r}`` (kind ``"leaf"``, attributes ``rail``,
        ``group``), ``spine{k}``, and ``nvswitch{node}`` when NVLink is included.

    References:
        NVIDIA DGX SuperPOD reference architectures (compute fabric: rail-optimized, 32 DGX
        systems and 8 rail leaves per scalable unit).
    """
    _check_count("n_nodes", n_nodes)
    _check_count("gpus_per_node", gpus_per_node)
    _check_count("n_spines", n_spines)
    _check_rate("nic_bytes_per_s", nic_bytes_per_s)
    nodes_per_group = n_nodes if nodes_per_group is None else nodes_per_group
    _check_count("nodes_per_group", nodes_per_group)
    if n_nodes % nodes_per_group:
        raise ValueError(f"nodes_per_group must divide n_nodes, got n_nodes={n_nodes} and "
                         f"nodes_per_group={nodes_per_group}.")
    if links_per_spine is None:
        links_per_spine = -(-nodes_per_group // n_spines)
    _check_count("links_per_spine", links_per_spine)
    uplink_bytes_per_s = nic_bytes_per_s if uplink_bytes_per_s is None else uplink_bytes_per_s
    _check_rate("uplink_bytes_per_s", uplink_bytes_per_s)
    if nvlink_bytes_per_s is not None:
        _check_rate("nvlink_bytes_per_s", nvlink_bytes_per_s)

    graph = nx.Graph(name=f"rail-optimized, {n_nodes} servers x {gpus_per_node} GPUs")
    spines = [f"spine{k}" for k in range(n_spines)]
    graph.add_nodes_from(spines, kind="spine")
    for g in range(n_nodes // nodes_per_group):
        rails = [f"su{g}.rail{r}" for r in range(gpus_per_node)]
        for r, leaf in enumerate(rails):
            graph.add_node(leaf, kind="leaf", rail=r, group=g)
            for spine in spines:
                _add_link(graph, leaf, spine, uplink_bytes_per_s, links_per_spine)
        for node in range(g * nodes_per_group, (g + 1) * nodes_per_group):
            if nvlink_bytes_per_s is not None:
                graph.add_node(f"nvswitch{node}", kind="nvswitch", node=node)
            for r in range(gpus_per_node):
                gpu = _add_gpu(graph, node * gpus_per_node + r, node=node, local_rank=r)
                _add_link(graph, gpu, rails[r], nic_bytes_per_s)
                if nvlink_bytes_per_s is not None:
                    _add_link(graph, gpu, f"nvswitch{node}", nvlink_bytes_per_s)
    return graph


def rail_pods(n_pods: int, nodes_per_pod: int, gpus_per_node: int = 8, *,
              nic_bytes_per_s: float = 50e9, nodes_per_group: int | None = None,
              spines_per_pod: int = 8, n_cores: int = 8, pod_oversubscription: float = 1.0,
              nvlink_bytes_per_s: float | None = None) -> nx.Graph:
    """Rail-optimized pods joined by a core tier that may be oversubscribed.

    Each pod is a non-blocking :func:`rail_optimized` fabric of ``nodes_per_pod`` servers
    (rail leaves in groups of ``nodes_per_group`` servers, ``spines_per_pod`` spines). Every
    pod spine is cabled to every core; a spine's uplink capacity is its downlink capacity
    divided by ``pod_oversubscription`` (7.0 for the 1:7 of the Llama 3 cluster, whose pods
    hold 3,072 GPUs).

    Args:
        n_pods: number of pods.
        nodes_per_pod: servers in each pod (GPUs: ``nodes_per_pod * gpus_per_node``).
        gpus_per_node: GPUs (and NICs, and rails) per server.
        nic_bytes_per_s: one NIC's rate per direction (also each leaf-spine cable).
        nodes_per_group: servers per rail leaf (default: the whole pod on one leaf per rail).
        spines_per_pod: spine switches in each pod.
        n_cores: core switches.
        pod_oversubscription: a pod spine's downlink over uplink capacity (>= 1).
        nvlink_bytes_per_s: NVLink per GPU; ``None`` leaves NVLink out.

    Returns:
        A graph with endpoints ``gpu{node * gpus_per_node + r}`` (attributes ``node``,
        ``local_rank``, ``pod``), leaves ``pod{p}.su{g}.rail{r}``, spines ``pod{p}.spine{k}``,
        cores ``core{c}`` and, with NVLink, ``nvswitch{node}``.

    References:
        Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.1 (3,072-GPU pods,
        1:7 between pods).
    """
    for name, value in (("n_pods", n_pods), ("nodes_per_pod", nodes_per_pod),
                        ("gpus_per_node", gpus_per_node), ("spines_per_pod", spines_per_pod),
                        ("n_cores", n_cores)):
        _check_count(name, value)
    _check_rate("nic_bytes_per_s", nic_bytes_per_s)
    if not (isinstance(pod_oversubscription, (int, float)) and pod_oversubscription >= 1):
        raise ValueError(f"pod_oversubscription must be a number >= 1 (1 = non-blocking, 7 = "
                         f"1:7), got {pod_oversubscription!r}.")
    graph = nx.Graph(name=f"{n_pods} rail-optimized pods of {nodes_per_pod * gpus_per_node} "
                          f"GPUs, 1:{pod_oversubscription:g} between pods")
    cores = [f"core{c}" for c in range(n_cores)]
    graph.add_nodes_from(cores, kind="core")
    for p in range(n_pods):
        pod = rail_optimized(nodes_per_pod, gpus_per_node, nic_bytes_per_s=nic_bytes_per_s,
                             nodes_per_group=nodes_per_group, n_spines=spines_per_pod,
                             nvlink_bytes_per_s=nvlink_bytes_per_s)
        offset = p * nodes_per_pod

        def rename(name, offset=offset, p=p):
            kind = pod.nodes[name]["kind"]
            if kind == ENDPOINT_KIND:
                return f"gpu{offset * gpus_per_node + pod.nodes[name]['index']}"
            if kind == "nvswitch":
                return f"nvswitch{offset + pod.nodes[name]['node']}"
            return f"pod{p}.{name}"

        for name, attrs in pod.nodes(data=True):
            attrs = dict(attrs, pod=p)
            if attrs["kind"] == ENDPOINT_KIND:
                attrs["index"] += offset * gpus_per_node
                attrs["node"] += offset
            elif attrs["kind"] == "nvswitch":
                attrs["node"] += offset
            graph.add_node(rename(name), **attrs)
        for u, v, attrs in pod.edges(data=True):
            graph.add_edge(rename(u), rename(v), **attrs)
        for k in range(spines_per_pod):
            spine = f"pod{p}.spine{k}"
            down = sum(e["bytes_per_s"] for _, _, e in graph.edges(spine, data=True))
            for core in cores:
                _add_link(graph, spine, core, down / pod_oversubscription / n_cores)
    return graph


def from_fabric(spec, *, nvlink: bool = False) -> nx.Graph:
    """Build the rail-optimized graph of a vendor reference fabric from
    :mod:`clusterlab.catalog.hardware`.

    Args:
        spec: a :class:`clusterlab.catalog.hardware.ReferenceFabric` or its name (e.g. ``"SuperPOD
        B200 4SU"``). nvlink: include each server's NVSwitch at the node's NVLink bandwidth.

    Returns:
        :func:`rail_optimized` with the fabric's servers, groups, spines and cables.
    """
    spec = hardware.fabric(spec) if isinstance(spec, str) else spec
    node = hardware.node(spec.node)
    links_per_spine, rest = divmod(spec.leaf_spine_cables, spec.n_leaves * spec.n_spines)
    if rest or links_per_spine == 0:
        raise ValueError(f"{spec.name}: {spec.leaf_spine_cables} leaf-spine cables cannot be "
                         f"spread evenly over {spec.n_leaves} leaves x {spec.n_spines} spines.")
    return rail_optimized(
        spec.n_groups * spec.nodes_per_group, node.gpus_per_node,
        nic_bytes_per_s=hardware.link(spec.link).bytes_per_s,
        nodes_per_group=spec.nodes_per_group, n_spines=spec.n_spines,
        links_per_spine=links_per_spine,
        nvlink_bytes_per_s=hardware.link(node.nvlink).bytes_per_s if nvlink else None)


# --------------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------------

def endpoints(graph: nx.Graph) -> list:
    """The endpoints (nodes of kind ``"gpu"``), in ``index`` order where nodes have one."""
    found = [n for n, kind in graph.nodes(data="kind") if kind == ENDPOINT_KIND]
    if not found:
        raise ValueError("The graph has no endpoints: no node has kind='gpu'.")
    if all("index" in graph.nodes[n] for n in found):
        found.sort(key=lambda n: graph.nodes[n]["index"])
    return found


def _check_node(graph: nx.Graph, node: Hashable) -> None:
    if node not in graph:
        raise ValueError(f"Node {node!r} is not in the graph. Endpoints are named like "
                         f"{endpoints(graph)[0]!r}.")


def hop_count(graph: nx.Graph, a: Hashable, b: Hashable) -> int:
    """Number of links on a shortest path from ``a`` to ``b``.

    Two hosts on the same leaf are 2 hops apart (host-leaf-host); on different leaves of a
    two-tier fat tree 4 (host-leaf-spine-leaf-host).
    """
    _check_node(graph, a)
    _check_node(graph, b)
    try:
        return nx.shortest_path_length(graph, a, b)
    except nx.NetworkXNoPath:
        raise ValueError(f"No path between {a!r} and {b!r}: the graph is disconnected.") from None


def shortest_path_count(graph: nx.Graph, a: Hashable, b: Hashable) -> int:
    """Number of distinct shortest paths from ``a`` to ``b`` (counted, not enumerated).

    In a two-tier fat tree, hosts on different leaves have one shortest path per spine: this is
    the path diversity that ECMP / adaptive routing spread flows over. Parallel cables merged
    into one edge count once.
    """
    _check_node(graph, a)
    _check_node(graph, b)
    # Breadth-first search from a, counting the shortest paths into every node.
    distance, count, frontier = {a: 0}, {a: 1}, [a]
    while frontier and b not in distance:
        nxt = []
        for u in frontier:
            for v in graph[u]:
                if v not in distance:
                    distance[v] = distance[u] + 1
                    count[v] = 0
                    nxt.append(v)
                if distance[v] == distance[u] + 1:
                    count[v] += count[u]
        frontier = nxt
    if b not in distance:
        raise ValueError(f"No path between {a!r} and {b!r}: the graph is disconnected.")
    return count[b]


def cut_bandwidth(graph: nx.Graph, side_a: Iterable, side_b: Iterable) -> float:
    """Most bytes/s that ``side_a`` can send to ``side_b`` at once (max-flow = min-cut).

    All of ``side_a`` is joined to a super-source and all of ``side_b`` to a super-sink; the
    max flow between them, with every edge's ``bytes_per_s`` as its capacity in each direction,
    is the capacity of the narrowest cut separating the two sides.

    Args:
        graph: a topology following this module's conventions.
        side_a: senders (any nodes of the graph).
        side_b: receivers, disjoint from ``side_a``.

    Returns:
        Bytes/s per direction.
    """
    side_a, side_b = list(side_a), list(side_b)
    if not side_a or not side_b:
        raise ValueError("Both sides of a cut need at least one node.")
    for node in side_a + side_b:
        _check_node(graph, node)
    if set(side_a) & set(side_b):
        raise ValueError(f"The two sides of a cut must be disjoint; both hold "
                         f"{sorted(set(side_a) & set(side_b), key=str)[:3]}.")
    flow_graph = nx.DiGraph()
    for u, v, capacity in graph.edges(data="bytes_per_s"):
        if capacity is None:
            raise ValueError(f"Edge {u!r}-{v!r} has no 'bytes_per_s' capacity.")
        flow_graph.add_edge(u, v, capacity=capacity)
        flow_graph.add_edge(v, u, capacity=capacity)
    source, sink = ("_source",), ("_sink",)
    for node in side_a:  # no 'capacity' attribute = unlimited
        flow_graph.add_edge(source, node)
    for node in side_b:
        flow_graph.add_edge(node, sink)
    return float(nx.maximum_flow_value(flow_graph, source, sink))


def bisection_bandwidth(graph: nx.Graph, *, halves: tuple[Sequence, Sequence] | None = None,
                        random_splits: int = 0, seed: int = 0) -> float:
    """Bisection bandwidth in bytes/s per direction, computed by max-flow/min-cut.

    The endpoints are split into two equal halves and the function returns the most traffic
    one half can send to the other at once (:func:`cut_bandwidth`). The default split is the
    first half against the second half of :func:`endpoints` (in index order: the first half of
    the leaves, servers or pods against the rest), the worst balanced split for the symmetric
    topologies this module builds, because every byte must then climb to the top tier.
    ``random_splits`` adds that many random balanced splits (seeded) and returns the minimum,
    a check for graphs where the ordered split is not the worst one. The true bisection
    bandwidth is the minimum over *all* balanced splits, so any value returned is an upper
    bound on it, exact when the worst split is among those tried.

    Args:
        graph: a topology following this module's conventions.
        halves: an explicit split ``(half_a, half_b)`` of the endpoints (equal sizes).
        random_splits: extra random balanced splits to take the minimum over.
        seed: seed of the random splits.

    Returns:
        Bytes/s per direction across the narrowest split tried. A non-blocking fat tree with
        H hosts on links of rate B gives ``H/2 * B``.

    References:
        Leiserson (1985), section I; Al-Fares et al. (2008), section 2.1.
    """
    _check_count("random_splits", random_splits, minimum=0)
    nodes = endpoints(graph)
    if halves is not None:
        half_a, half_b = list(halves[0]), list(halves[1])
        if len(half_a) != len(half_b):
            raise ValueError(f"The two halves must have equal sizes, got {len(half_a)} and "
                             f"{len(half_b)}.")
        splits = [(half_a, half_b)]
    else:
        if len(nodes) < 2 or len(nodes) % 2:
            raise ValueError(f"Bisection needs an even number of endpoints (>= 2), the graph "
                             f"has {len(nodes)}.")
        half = len(nodes) // 2
        splits = [(nodes[:half], nodes[half:])]
        rng = random.Random(seed)
        for _ in range(random_splits):
            shuffled = nodes[:]
            rng.shuffle(shuffled)
            splits.append((shuffled[:half], shuffled[half:]))
    return min(cut_bandwidth(graph, a, b) for a, b in splits)


def oversubscription(graph: nx.Graph, switch: Hashable) -> float:
    """Downlink capacity over uplink capacity of one switch (1.0 = non-blocking, 2.0 = 2:1).

    Downlinks go to the tier below (a leaf's endpoints, a spine's leaves), uplinks to the tier
    above (see :data:`TIERS`); links to an NVSwitch are neither.

    Raises:
        ValueError: for an endpoint or NVSwitch, or a switch with no uplinks (the top tier).
    """
    _check_node(graph, switch)
    kind = graph.nodes[switch].get("kind")
    if kind not in ("leaf", "spine", "core"):
        raise ValueError(f"Oversubscription is defined for leaf, spine and core switches; "
                         f"{switch!r} has kind {kind!r}.")
    tier = TIERS[kind]
    down = up = 0.0
    for neighbour, edge in graph[switch].items():
        other = graph.nodes[neighbour].get("kind")
        if other == "nvswitch":
            continue
        if TIERS[other] < tier:
            down += edge["bytes_per_s"]
        elif TIERS[other] > tier:
            up += edge["bytes_per_s"]
    if up == 0:
        raise ValueError(f"{switch!r} has no uplinks (it is in the top tier), so it has no "
                         f"oversubscription.")
    return down / up


def count_kinds(graph: nx.Graph) -> dict[str, int]:
    """How many nodes of each kind the graph has, e.g. ``{"gpu": 16, "leaf": 4, "spine": 4}``."""
    counts: dict[str, int] = {}
    for _, kind in graph.nodes(data="kind"):
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def draw(graph: nx.Graph, ax=None, *, labels: bool = True, node_size: float = 300):
    """Draw a topology in rows (switch tiers above the GPUs, NVSwitches below them).

    Edge width grows with capacity.

    Args:
        graph: a topology following this module's conventions.
        ax: matplotlib axes (default: a new figure).
        labels: write node names on the nodes.
        node_size: marker size of the nodes.

    Returns:
        The matplotlib axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    colors = {"gpu": "#76b900", "nvswitch": "#9467bd", "leaf": "#1f77b4", "spine": "#ff7f0e",
              "core": "#d62728"}
    # Rows: endpoints at 0, NVSwitches below them (inside the servers), the fabric above.
    rows = {"gpu": 0, "nvswitch": -1, "leaf": 1, "spine": 2, "core": 3}
    names = {-1: "NVSwitch", 0: "GPUs", 1: "leaf", 2: "spine", 3: "core"}
    tiers: dict[int, list] = {}
    for node, kind in graph.nodes(data="kind"):
        tiers.setdefault(rows.get(kind, 0), []).append(node)
    # Order each row so that neighbours sit near each other: endpoints by index, switches by the
    # mean position of the endpoints / lower switches they connect to. Rows are centred.
    x: dict = {}
    for row in sorted(tiers, key=lambda r: (r < 0, abs(r))):
        members = tiers[row]
        if row == 0:
            order = sorted(members, key=lambda n: graph.nodes[n].get("index", 0))
        else:
            def key(n):
                placed = [x[m] for m in graph[n] if m in x]
                return (sum(placed) / len(placed) if placed else 0.0, str(n))
            order = sorted(members, key=key)
        for i, node in enumerate(order):
            x[node] = (i + 0.5) / len(order)
    pos = {node: (x[node], rows.get(kind, 0)) for node, kind in graph.nodes(data="kind")}
    widths = [edge for _, _, edge in graph.edges(data="bytes_per_s")]
    largest = max(widths) if widths else 1.0
    nx.draw_networkx_edges(graph, pos, ax=ax, alpha=0.4,
                           width=[0.5 + 2.5 * w / largest for w in widths])
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_size=node_size,
                           node_color=[colors.get(k, "grey") for _, k in graph.nodes(data="kind")])
    if labels:
        nx.draw_networkx_labels(graph, pos, ax=ax, font_size=7)
    used = sorted({p[1] for p in pos.values()})
    ax.set_yticks(used)
    ax.set_yticklabels([names.get(r, str(r)) for r in used])
    ax.tick_params(left=False, labelleft=True, bottom=False, labelbottom=False)
    ax.set_xlim(-0.02, 1.02)
    ax.grid(False)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return ax
