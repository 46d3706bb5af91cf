"""clusterlab.analytic.fabric against SimGrid, an established flow-level simulator (cross-check).

The same step of a collective (the same flows, on the same links, along the same routes) is
timed twice: by :func:`clusterlab.analytic.fabric.step_seconds` and by SimGrid 3.32's network model.
SimGrid runs in its ideal-factor mode, so that both are the same fluid model of max-min fair
sharing and differ only in their implementation (SimGrid's lmm solver and event loop against
the vectorised progressive filling and closed form here):

* ``network/model:CM02`` (Casanova & Marchal's max-min model; LV08, the default, multiplies
  bandwidths by 0.97 and latencies by 13.01), ``network/bandwidth-factor:1``,
  ``network/latency-factor:1``;
* ``network/weight-S:0`` (no RTT-weighted unfairness: plain max-min),
  ``network/TCP-gamma:0`` (no TCP window bound), ``network/crosstraffic:0`` (no ACK traffic
  on the reverse links);
* every directed link of the fabric becomes one SHARED SimGrid link of the same capacity and
  zero latency, and every flow's route is the list of links ``fabric.route`` chose
  (``policy="dmodk"``: one deterministic path per pair, which SimGrid's routing tables hold).

The fabrics are two-tier fat trees (``topology.fat_tree``) of 16, 64 and 256 hosts, without
oversubscription and at 2:1; the steps are a ring step (hosts in order, and in a shuffled
order that collides on the spines), an all-to-all (uniform, and one skewed so that flows
end at different times and rates are shared again) and the steady state of a double binary
tree all-reduce (both trees' edges, each carrying half the buffer up and down at once: 64
hosts in order and shuffled, at 1:1 and 2:1, and 256 shuffled hosts at 2:1). Agreement
asserted: 1e-6 relative.

How SimGrid is reached: Debian's ``python3-simgrid`` (``apt-get install -y python3-simgrid``,
done by ``.ci/run``) installs one extension module,
``/usr/lib/python3/dist-packages/simgrid.cpython-311-x86_64-linux-gnu.so``. Rather than putting
all of Debian's dist-packages on the venv's path, the runner loads that one file by its path
(``importlib.util.spec_from_file_location``), in a fresh process per simulation (SimGrid's
engine is a once-per-process singleton): this file run as a script.

References:
    H. Casanova, A. Giersch, A. Legrand, M. Quinson, F. Suter, "Versatile, Scalable, and
    Accurate Simulation of Distributed Applications and Platforms", JPDC 74(10), 2014.
    https://simgrid.org/doc/3.32/Configuring_SimGrid.html (network model options).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

SIMGRID_DIR = Path("/usr/lib/python3/dist-packages")
INSTALL_HINT = ("SimGrid is missing: run `apt-get install -y python3-simgrid` (Debian's 3.32; "
                ".ci/run installs it).")


def simgrid_module_path() -> Path:
    """The path of Debian's simgrid extension module for this Python, or fail naming the fix."""
    path = SIMGRID_DIR / f"simgrid{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not path.exists():
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


def _load_simgrid(path: str):
    spec = importlib.util.spec_from_file_location("simgrid", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _simulate(spec_file: str) -> None:
    """Run one step in SimGrid (in this fresh process) and print its duration as JSON."""
    spec = json.loads(Path(spec_file).read_text())
    sg = _load_simgrid(spec["module"])
    engine = sg.Engine(["fabric", "--cfg=network/model:CM02",
                        "--cfg=network/bandwidth-factor:1", "--cfg=network/latency-factor:1",
                        "--cfg=network/weight-S:0", "--cfg=network/TCP-gamma:0",
                        "--cfg=network/crosstraffic:0", "--log=root.thres:critical"])
    zone = sg.NetZone.create_full_zone("fabric")
    hosts = {h: zone.create_host(f"h{h}", 1e9) for h in spec["hosts"]}
    links = {}
    for name, rate in spec["links"]:
        link = zone.create_link(name, rate)
        link.set_latency(0)
        links[name] = link.seal()
    for src, dst, route in spec["routes"]:
        zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None,
                       [sg.LinkInRoute(links[name]) for name in route], False)
    zone.seal()
    finished = []

    def driver():
        comms = [sg.Comm.sendto_async(hosts[s], hosts[d], size)
                 for s, d, size in spec["flows"]]
        sg.Comm.wait_all(comms)
        finished.append(sg.Engine.clock)

    sg.Actor.create("driver", hosts[spec["hosts"][0]], driver)
    engine.run()
    print(json.dumps({"seconds": finished[0]}))


def simgrid_step_seconds(fabric_, src, dst, nbytes, tmp_path) -> float:
    """SimGrid's time for flows ``src[i] -> dst[i]`` of ``nbytes[i]`` on the model's routes.

    SimGrid counts whole bytes: ``nbytes`` must hold integers (see :func:`_whole_bytes`).
    """
    assert np.array_equal(nbytes, np.round(nbytes)), "SimGrid sends whole bytes"
    incidence, flow_of, _ = fabric_.route(src, dst, policy="dmodk")
    incidence = incidence.tocsc()
    used = sorted(set(incidence.indices.tolist()))
    routes, seen = [], set()
    for f in range(len(src)):
        pair = (int(src[f]), int(dst[f]))
        arcs = incidence.indices[incidence.indptr[f]:incidence.indptr[f + 1]]
        # Order the links along the path: the route is a chain tail -> head.
        by_tail = {int(fabric_.tail[a]): int(a) for a in arcs}
        node, chain = fabric_._node([pair[0]])[0], []
        while node in by_tail:
            chain.append(f"l{by_tail[node]}")
            node = int(fabric_.head[by_tail[node]])
        assert len(chain) == len(arcs)
        if pair not in seen:
            seen.add(pair)
            routes.append([pair[0], pair[1], chain])
    spec = {"module": str(simgrid_module_path()),
            "hosts": sorted(set(np.concatenate([src, dst]).tolist())),
            "links": [[f"l{a}", float(fabric_.capacity_bytes_per_s[a])] for a in used],
            "routes": routes,
            "flows": [[int(s), int(d), int(b)] for s, d, b in zip(src, dst, nbytes)]}
    spec_file = tmp_path / "step.json"
    spec_file.write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, __file__, str(spec_file)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["seconds"]


# --- The cross-check ----------------------------------------------------------------------------

from clusterlab.analytic import fabric, topology  # noqa: E402

GB = 1e9
CASES = [  # (hosts per leaf = leaves, spines): 1:1 when spines == hosts per leaf
    (4, 4), (4, 2), (8, 8), (8, 4), (16, 16), (16, 8)]


def _whole_bytes(step: fabric.Step) -> fabric.Step:
    """The step with every flow rounded to whole bytes (what SimGrid sends)."""
    return step._replace(nbytes=np.round(step.nbytes))


def _fabric(side: int, spines: int) -> fabric.Fabric:
    graph = topology.fat_tree(side, side, spines, 50 * GB)
    return fabric.Fabric(graph, net_hop_latency_s=0.0)


@pytest.mark.parametrize("side,spines", CASES)
@pytest.mark.parametrize("order", ["in order", "shuffled"])
def test_ring_step_agrees_with_simgrid(side, spines, order, tmp_path):
    f = _fabric(side, spines)
    n = side * side
    ranks = np.arange(n) if order == "in order" else np.random.default_rng(side).permutation(n)
    step = fabric.steps(f, "all_reduce", 64 * 2**20, ranks, aware=False)[0]
    step = _whole_bytes(step)
    ours, _ = fabric.step_time(f, step, policy="dmodk")
    theirs = simgrid_step_seconds(f, step.src, step.dst, step.nbytes, tmp_path)
    assert ours == pytest.approx(theirs, rel=1e-6)


@pytest.mark.parametrize("side,spines", CASES[:4])
def test_all_to_all_step_agrees_with_simgrid(side, spines, tmp_path):
    f = _fabric(side, spines)
    step = fabric.steps(f, "all_to_all", 64 * 2**20)[0]
    step = _whole_bytes(step)
    ours, _ = fabric.step_time(f, step, policy="dmodk")
    theirs = simgrid_step_seconds(f, step.src, step.dst, step.nbytes, tmp_path)
    assert ours == pytest.approx(theirs, rel=1e-6)


@pytest.mark.parametrize("side,spines", [(4, 2), (8, 4)])
def test_skewed_all_to_all_reshares_like_simgrid(side, spines, tmp_path):
    # Unequal flows end at different times: the event-driven re-sharing is what is compared.
    f = _fabric(side, spines)
    n = side * side
    load = np.random.default_rng(1).gamma(1.0, size=n)
    step = _whole_bytes(fabric.steps(f, "all_to_all", 64 * 2**20, load=load)[0])
    assert np.ptp(step.nbytes) > 0
    ours, _ = fabric.step_time(f, step, policy="dmodk")
    theirs = simgrid_step_seconds(f, step.src, step.dst, step.nbytes, tmp_path)
    assert ours == pytest.approx(theirs, rel=1e-6)


@pytest.mark.parametrize("side,spines,order", [
    (8, 8, "in order"), (8, 8, "shuffled"), (8, 4, "in order"), (8, 4, "shuffled"),
    (16, 8, "shuffled")])
def test_tree_step_agrees_with_simgrid(side, spines, order, tmp_path):
    f = _fabric(side, spines)
    n = side * side
    ranks = np.arange(n) if order == "in order" else np.random.default_rng(side).permutation(n)
    (step,) = fabric.steps(f, "all_reduce", 64 * 2**20, ranks, algorithm="tree")
    step = _whole_bytes(step)
    assert len(step.src) == 4 * (n - 1)          # two trees, n - 1 edges each, up and down
    ours, _ = fabric.step_time(f, step, policy="dmodk")
    if order == "shuffled":     # the case is really contended: the core slows it
        free, _ = fabric.step_time(f, step, policy="dmodk",
                                   capacity_bytes_per_s=f.core_free_capacity())
        assert ours > 1.5 * free
    theirs = simgrid_step_seconds(f, step.src, step.dst, step.nbytes, tmp_path)
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_the_comparison_can_fail(tmp_path):
    # Negative control: the same flows with one spine link at half its capacity in SimGrid
    # only must not agree, so the cross-check is not comparing a number with itself.
    f = _fabric(4, 2)
    ranks = np.random.default_rng(4).permutation(16)
    step = fabric.steps(f, "all_reduce", 64 * 2**20, ranks, aware=False)[0]
    step = _whole_bytes(step)
    ours, _ = fabric.step_time(f, step, policy="dmodk")
    spine_arcs = [a for a in range(f.n_arcs) if f.names[f.tail[a]].startswith("leaf")
                  and f.names[f.head[a]].startswith("spine")]
    f.capacity_bytes_per_s[spine_arcs] /= 2
    theirs = simgrid_step_seconds(f, step.src, step.dst, step.nbytes, tmp_path)
    assert theirs > ours * 1.2


if __name__ == "__main__":
    _simulate(sys.argv[1])
