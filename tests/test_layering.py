"""clusterlab's four layers: nothing lower imports higher, no import circle, no JAX below devices.

DESIGN.md orders the library in four layers, each importing only its own and those below it:

1. catalog: hardware, published, and their input checks;
2. analytical models (NumPy only): the cost model, the planner, the fabric, memory, FLOPs, ...;
3. device code (JAX): devices, benchmarks, collectives, models, parallel strategies, ...;
4. course machinery: checks, grading, student copies, plotting, the command line.

Every module of ``lib/clusterlab`` is parsed with ``ast`` (no import runs), and every import in it
is an arrow, at the top of the module or inside a function alike: an import inside a function
runs as surely as one at the top, only later. A module's layer is that of its top-level name
under ``clusterlab`` (``clusterlab.costmodel._nccl`` is ``costmodel``'s), so a new submodule of a
package falls in its package's layer, and a new top-level module must be placed here first. The
last tests run the same checker on made-up graphs and show that it reports an upward arrow, a
circle and JAX in an analytical module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "clusterlab"
SOURCE = Path(__file__).resolve().parents[1] / "lib" / PACKAGE

CATALOG, ANALYTICAL, DEVICE, COURSE = 1, 2, 3, 4
LAYER_NAMES = {CATALOG: "catalog", ANALYTICAL: "analytical models", DEVICE: "device code",
               COURSE: "course machinery"}
# Keyed by the top-level name under clusterlab: a package's submodules share its layer.
LAYERS = {
    # 1. catalog
    "hardware": CATALOG, "published": CATALOG, "_checks": CATALOG,
    # 2. analytical models: NumPy, no JAX (tables formats text and sizes, with no JAX either)
    "costmodel": ANALYTICAL, "plan": ANALYTICAL, "serving": ANALYTICAL, "moe": ANALYTICAL,
    "memory": ANALYTICAL, "flops": ANALYTICAL, "storage": ANALYTICAL,
    "reliability": ANALYTICAL, "fabric": ANALYTICAL, "topology": ANALYTICAL,
    "schedule": ANALYTICAL, "tables": ANALYTICAL, "gemm": ANALYTICAL,
    # 3. device code
    "devices": DEVICE, "bench": DEVICE, "collectives": DEVICE, "hlo": DEVICE, "models": DEVICE,
    "parallel": DEVICE, "dataloader": DEVICE, "checkpoint": DEVICE, "decode": DEVICE,
    "distributed": DEVICE, "launch": DEVICE, "_job": DEVICE, "train_demo": DEVICE,
    "killtest": DEVICE, "profile": DEVICE,
    # 4. course machinery
    "check": COURSE, "answers": COURSE, "verification": COURSE, "grading": COURSE,
    "student": COURSE, "submission": COURSE, "sandbox": COURSE, "plotting": COURSE,
    "expect": COURSE, "__main__": COURSE,
    "examples": COURSE,
}
# Libraries built on JAX: none may be imported below the device layer.
JAX_LIBRARIES = frozenset({"jax", "jaxlib", "optax", "orbax", "grain", "flax", "equinox", "chex"})


def module_name(path: Path, root: Path = SOURCE) -> str:
    """``lib/clusterlab/costmodel/_nccl.py`` -> ``clusterlab.costmodel._nccl`` (a package's
    ``__init__.py`` is the package)."""
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
              modules: set[str]) -> set[str]:
    """The absolute names one import statement brings in: a module of the library where it
    names one (``from clusterlab import hlo`` is ``clusterlab.hlo``), else what it names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = ".".join(filter(None, [package, node.module]))
    else:
        base = node.module or ""
    names = set()
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        names.add(candidate if candidate in modules else base)
    return names


def import_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    """Every module of the library and everything it imports, anywhere in its code.

    Returns:
        Module name -> the names it imports: modules of the library (the most specific one an
        import names), and the top-level names of everything else (``jax``, ``numpy``).
    """
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= _imported(node, name, path.name == "__init__.py", modules)
        graph[name] = {t if t.startswith(PACKAGE + ".") or t == PACKAGE else t.split(".")[0]
                       for t in targets} - {name}  # __main__ copies import themselves
    return graph


def layer_of(module: str) -> int | None:
    """The layer of a module of the library (``None``: the package root, or not placed)."""
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Modules of the library that LAYERS does not place."""
    return sorted(m for m in graph if m != PACKAGE and layer_of(m) is None)


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module of a higher layer, as ``"a (layer) imports b (layer)"``."""
    found = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(importer), layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{importer} ({LAYER_NAMES[low]}) imports {target} "
                             f"({LAYER_NAMES[high]})")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles among the library's modules: each strongly connected component of
    more than one module (Tarjan's algorithm), as a sorted list of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in graph:
                continue  # not a module of the library
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def jax_below_devices(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a JAX library by a catalog or analytical module."""
    return [f"{module} ({LAYER_NAMES[layer_of(module)]}) imports {target}"
            for module, targets in sorted(graph.items())
            if (layer_of(module) or DEVICE) < DEVICE
            for target in sorted(targets & JAX_LIBRARIES)]


# --- the library ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    assert unplaced(graph) == [], ("place these modules in a layer (LAYERS in "
                                   "tests/test_layering.py; DESIGN.md lists the layers)")


def test_nothing_imports_a_higher_layer(graph):
    assert upward_arrows(graph) == []


def test_there_is_no_import_circle(graph):
    assert circles(graph) == []


def test_the_catalog_and_the_analytical_models_import_no_jax(graph):
    assert jax_below_devices(graph) == []


def test_the_graph_sees_function_level_and_package_imports(graph):
    # What the checks above rest on, read from the real modules: an import inside a function
    # (grading's JAX, for code exercises), a name imported from the package that is a module
    # (check's "from clusterlab import answers, grading"), a submodule of a package.
    assert "jax" in graph["clusterlab.grading"]
    assert {"clusterlab.answers", "clusterlab.grading"} <= graph["clusterlab.check"]
    assert any(m.startswith("clusterlab.costmodel.") for m in graph)
    assert layer_of("clusterlab.costmodel._nccl") == ANALYTICAL


# --- the checker catches what it is there to catch (negative controls) ------------------------

def _fake_library(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    root = tmp_path / PACKAGE
    for relative, text in {"__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(root)


def test_an_upward_arrow_inside_a_function_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {
        "hardware.py": "def gpu():\n    from clusterlab import bench\n    return bench\n",
        "bench.py": "import numpy\n",
    })
    assert upward_arrows(fake) == [
        "clusterlab.hardware (catalog) imports clusterlab.bench (device code)"]


def test_a_circle_through_a_package_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {
        "costmodel/__init__.py": "from .traffic import bytes_moved\n",
        "costmodel/traffic.py": "from clusterlab.fabric import steps\n",
        "fabric.py": "from clusterlab import costmodel\n",
    })
    assert upward_arrows(fake) == []  # all three are analytical: only the circle is wrong
    assert circles(fake) == [["clusterlab.costmodel", "clusterlab.costmodel.traffic",
                              "clusterlab.fabric"]]


def test_jax_in_an_analytical_module_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {"memory.py": "import jax.numpy as jnp\n",
                                    "devices.py": "import jax\n"})
    assert jax_below_devices(fake) == ["clusterlab.memory (analytical models) imports jax"]


def test_a_new_module_without_a_layer_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {"profile_new.py": "import numpy\n"})
    assert unplaced(fake) == ["clusterlab.profile_new"]
