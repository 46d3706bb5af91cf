"""The book's four explorers (clusterlab.course.explorers): their grids are clusterlab's numbers,
and in the rendered book every control moves the numbers shown to clusterlab's for that input.

The references below call the library directly (the planner, the NCCL model, the flow-level
fabric model) with the inputs each explorer states; they share nothing with the explorers'
own code but those stated inputs. The browser tests reuse test_browser.py's served book
(``site``) and its watched tabs, and save screenshots of each explorer at 1280 and 390 px.
"""

from __future__ import annotations

import functools
import json
import math
import re

import pytest
from test_browser import SCREENSHOTS, _watched_page, site  # noqa: F401 (site: a fixture)

from clusterlab.analytic import costmodel, fabric, plan, topology
from clusterlab.catalog import hardware
from clusterlab.course import explorers

PAGES = {"memory": "chapters/05-parallelism-strategies",
         "collective": "chapters/04b-nccl-on-a-cluster",
         "planner": "chapters/08-planning-a-cluster",
         "fabric": "chapters/03-the-cluster-fabric"}
# The page stores numbers to explorers.JSON_DIGITS significant digits.
STORED_RTOL = 1e-7


def memory_reference(n_params, zero_stage, tp, pp, recompute, fp32_grads) -> dict:
    workload = plan.Workload(n_params, explorers.MEMORY_SEQ_LEN, explorers.MEMORY_GLOBAL_BATCH,
                             n_tokens=1e12, recompute=recompute)
    cluster = plan.cluster(explorers.MEMORY_GPU, explorers.MEMORY_GPUS,
                           storage_read_bytes_per_s=explorers.STORAGE_BYTES_PER_S)
    layout = plan.Layout(dp=explorers.MEMORY_GPUS // (tp * pp), tp=tp, pp=pp,
                         zero_stage=zero_stage)
    p = plan.predict(workload, cluster, layout, plan.Assumptions(fp32_grad_accumulation=fp32_grads))
    return {"states": p.states_bytes, "activations": p.activation_bytes, "total": p.memory_bytes,
            "limit": p.memory_limit_bytes, "dp": layout.dp,
            "fits": "fits" if p.fits else "does not fit"}


def collective_reference(server, n_nodes, nics_per_node, algorithm, nbytes) -> dict:
    cluster = hardware.ClusterSpec.from_node(server, n_nodes=n_nodes, nics_per_node=nics_per_node)
    e = costmodel.cluster_collective("all_reduce", nbytes, cluster, algorithm=algorithm)
    return {"time": e.time_s, "busbw": e.busbw, "algorithm": e.algorithm,
            "protocol": e.protocol, "bottleneck": e.bottleneck}


@functools.cache
def _ranking(case: str) -> list[plan.Plan]:
    workload, n_gpus = explorers.PLANNER_CASES[case]
    cluster = plan.cluster("H100", n_gpus, storage_read_bytes_per_s=explorers.STORAGE_BYTES_PER_S)
    return plan.rank_layouts(plan.Workload(**workload), cluster, limit=explorers.PLANNER_LAYOUTS)


def planner_reference(case, rank) -> dict:
    p = _ranking(case)[rank]
    return {"layout": plan.search.layout_label(p), "step": p.step_s, "mfu": p.mfu,
            "memory": p.memory_bytes, "bottleneck": p.bottleneck, **p.breakdown()}


def fabric_reference(qps, oversubscription, placement, policy) -> dict:
    graph = topology.fat_tree(4, 16, 16 // oversubscription,
                              hardware.link(explorers.FABRIC_LINK).bytes_per_s)
    net = fabric.Fabric(graph)
    args = dict(ranks=explorers.FABRIC_PLACEMENTS[placement], aware=False, policy=policy,
                seed=explorers.FABRIC_SEED, qps=qps)
    result = fabric.collective(net, "all_reduce", 2**30, **args)
    return {"busbw": result.busbw, "time": result.time_s,
            "factor": fabric.contention_factor(net, 2**30, **args)}


REFERENCES = {"memory": memory_reference, "collective": collective_reference,
              "planner": planner_reference, "fabric": fabric_reference}


@pytest.fixture(scope="module")
def built() -> dict[str, explorers.Explorer]:
    return {"memory": explorers.memory_explorer(), "collective": explorers.collective_explorer(),
            "planner": explorers.planner_explorer(), "fabric": explorers.fabric_explorer()}


def reference_for(explorer: explorers.Explorer, choice: dict[str, int]) -> dict:
    """The library's outputs for a choice of option indices, or ``{"error": message}``."""
    values = {c.name: c.options[choice.get(c.name, c.default)].value for c in explorer.controls}
    try:
        return REFERENCES[explorer.name](**values)
    except ValueError as error:
        return {"error": str(error)}


def one_at_a_time(explorer: explorers.Explorer):
    """Every option of every control, the others at their defaults."""
    for control in explorer.controls:
        for index in range(len(control.options)):
            yield control, index


def test_every_explorer_has_controls_outputs_and_results(built):
    for explorer in built.values():
        assert len(explorer.controls) >= 2 and explorer.outputs
        assert len(explorer.cells) == math.prod(len(c.options) for c in explorer.controls)
        assert "values" in explorer.cell({}), (explorer.name, explorer.cell({}))
    # The memory explorer has every control the issue names.
    assert {c.name for c in built["memory"].controls} == {
        "n_params", "zero_stage", "tp", "pp", "recompute", "fp32_grads"}


@pytest.mark.parametrize("name", list(PAGES))
def test_grid_cells_are_clusterlabs_numbers(built, name):
    explorer = built[name]
    checked = 0
    for control, index in one_at_a_time(explorer):
        choice = {control.name: index}
        reference = reference_for(explorer, choice)
        cell = explorer.cell(choice)
        if "error" in reference:
            assert cell == reference, (choice, cell)
        else:
            assert cell["values"] == {o.name: reference.get(o.name, 0.0)
                                      for o in explorer.outputs}, choice
        checked += 1
    assert checked == sum(len(c.options) for c in explorer.controls)


def test_an_explorer_shows_the_error_clusterlab_raises(built):
    explorer = built["collective"]
    nvls = [o.value for o in explorer.control("algorithm").options].index("nvls")
    choice = {"algorithm": nvls}  # four nodes by default: NVLS runs inside one node only
    with pytest.raises(ValueError) as raised:
        collective_reference(**{c.name: c.options[choice.get(c.name, c.default)].value
                                for c in explorer.controls})
    assert explorer.cell(choice) == {"error": str(raised.value)}


def test_the_page_data_decodes_to_the_grid(built):
    for explorer in built.values():
        spec = json.loads(explorer.to_json())
        for key, cell in explorer.cells.items():
            stored = spec["cells"][key]
            if "error" in cell:
                assert spec["errors"][stored] == cell["error"]
                continue
            for output, value in zip(explorer.outputs, stored):
                exact = cell["values"][output.name]
                if output.kind == "text":
                    assert value == exact
                else:
                    assert math.isclose(value * output.scale, exact, rel_tol=STORED_RTOL,
                                        abs_tol=1e-12), (explorer.name, key, output.name)
    # The fragment cannot end its own script element early.
    assert "</script>" not in built["planner"].to_json().replace("<\\/", "")


def test_static_figure_draws_the_chart_at_the_defaults(built):
    line = explorers.static_figure(built["collective"])
    (curve,) = line.axes[0].get_lines()
    sizes = built["collective"].control("nbytes").options
    assert len(curve.get_xdata()) == len(sizes)
    default = built["collective"].cell({})["values"]["busbw"]
    assert curve.get_ydata()[built["collective"].control("nbytes").default] == default / 1e9
    stacks = explorers.static_figure(built["memory"])
    bars = [p for p in stacks.axes[0].patches]
    assert len(bars) == 2 * len(built["memory"].control("zero_stage").options)


def test_bad_explorer_specs_are_refused():
    options = (explorers.Option("a", 1),)
    with pytest.raises(ValueError, match="default 3 is not an index"):
        explorers.Control("c", "C", options, default=3)
    with pytest.raises(ValueError, match="not one of its controls"):
        explorers.build("x", "X", "", [explorers.Control("c", "C", options)],
                        [explorers.Output("y", "Y")], explorers.Chart("line", over="d", y="y"),
                        lambda c: {"values": {"y": c}})
    explorer = explorers.build("x", "X", "", [explorers.Control("c", "C", options)],
                               [explorers.Output("y", "Y")],
                               explorers.Chart("line", over="c", y="y"),
                               lambda c: {"values": {"y": c}})
    with pytest.raises(ValueError, match="has no control 'd'"):
        explorer.control("d")
    with pytest.raises(ValueError, match="has no control"):
        explorers.build("x", "X", "", [explorers.Control("c", "C", options)],
                        [explorers.Output("y", "Y")], explorers.Chart("line", over="c", y="y"),
                        lambda c: {"values": {"y": c}}).key({"d": 0})


# --- In the rendered book ---------------------------------------------------------------------

_READ_JS = """root => {
  const error = root.querySelector('.cl-error');
  return {
    outputs: Array.from(root.querySelectorAll('[data-output]'),
                        n => [n.dataset.output, n.dataset.value ?? null, n.textContent]),
    error: error.hidden ? null : error.textContent,
  };
}"""


def _move(root, control: explorers.Control, index: int) -> None:
    """Move a control as a reader does: arrow keys on a slider, a pick in a select."""
    widget = root.locator(f"[data-control='{control.name}']")
    if control.kind == "slider":
        widget.focus()
        widget.press("Home")
        for _ in range(index):
            widget.press("ArrowRight")
        assert widget.input_value() == str(index)
    else:
        widget.select_option(str(index))


def _shown_number(text: str, unit: str) -> float:
    number = text.removesuffix(" " + unit) if unit else text
    assert re.fullmatch(r"-?[\d,]+(\.\d+)?(e[-+]\d+)?", number), text
    return float(number.replace(",", ""))


def _check_shown(explorer: explorers.Explorer, shown: dict, reference: dict, where: str):
    if "error" in reference:
        assert shown["error"] == "No result here: " + reference["error"], where
        assert all(text == "–" and value is None for _, value, text in shown["outputs"]), where
        return
    assert shown["error"] is None, (where, shown["error"])
    by_name = {name: (value, text) for name, value, text in shown["outputs"]}
    assert list(by_name) == [o.name for o in explorer.outputs], where
    for output in explorer.outputs:
        value, text = by_name[output.name]
        exact = reference.get(output.name, 0.0)  # a breakdown part the layout lacks: 0 s
        if output.kind == "text":
            assert text == value == exact, (where, output.name, text, exact)
            continue
        assert math.isclose(float(value) * output.scale, exact, rel_tol=STORED_RTOL,
                            abs_tol=1e-12), (where, output.name, value, exact)
        # Shown to three significant digits (whole numbers from 100 up).
        in_unit = exact / output.scale
        digit = 10.0 ** (math.floor(math.log10(abs(in_unit))) - 2) if in_unit else 0.0
        assert abs(_shown_number(text, output.unit) - in_unit) <= 0.5 * max(digit, 1e-12) + (
            0.5 if abs(in_unit) >= 100 else 0), (where, output.name, text, exact)


@pytest.mark.parametrize("name", list(PAGES))
def test_each_control_shows_clusterlabs_number(site, built, name):  # noqa: F811
    explorer = built[name]
    page, problems = _watched_page(site)
    site["state"]["page"] = PAGES[name]
    page.goto(site["base"] + PAGES[name] + ".html")
    root = page.locator(f"#explorer-{name}")
    root.locator("[data-output]").first.wait_for(timeout=10_000)
    assert root.get_attribute("data-ready") == "true"
    _check_shown(explorer, root.evaluate(_READ_JS), reference_for(explorer, {}), "defaults")
    moves = 0
    for control in explorer.controls:
        for index in range(len(control.options)):
            _move(root, control, index)
            where = f"{control.name} = {control.options[index].label}"
            _check_shown(explorer, root.evaluate(_READ_JS),
                         reference_for(explorer, {control.name: index}), where)
            moves += 1
        _move(root, control, control.default)
    assert moves == sum(len(c.options) for c in explorer.controls)
    page.close()
    assert not problems, problems
    assert not site["external"], site["external"]


@pytest.mark.parametrize("name", list(PAGES))
def test_explorer_fits_a_phone_and_is_photographed(site, name):  # noqa: F811
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for label, width in (("desktop", 1280), ("phone", 390)):
        page, problems = _watched_page(site)
        page.set_viewport_size({"width": width, "height": 900})
        site["state"]["page"] = PAGES[name]
        page.goto(site["base"] + PAGES[name] + ".html")
        root = page.locator(f"#explorer-{name}")
        root.locator("svg.cl-chart text").first.wait_for(timeout=10_000)
        overflow = root.evaluate("r => r.scrollWidth - r.clientWidth")
        assert overflow <= 0, (name, width, overflow)
        path = SCREENSHOTS / f"explorer-{name}-{label}.png"
        root.screenshot(path=str(path))
        assert path.stat().st_size > 10_000, path
        page.close()
        assert not problems, problems
