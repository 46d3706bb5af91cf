"""clusterlab's four layers are its four packages: nothing lower imports higher, no import
circle, no JAX in the catalog or the analytical models, and nothing they import at load time that
the base install lacks.

The packages, lowest first (the root ``clusterlab/__init__`` says what each is for):

1. ``clusterlab.catalog``: hardware and published measurements;
2. ``clusterlab.analytic``: the models (NumPy, SciPy, networkx; no JAX);
3. ``clusterlab.device``: code on JAX devices;
4. ``clusterlab.course``: checks, grading, student copies, plotting, the command line.

A module's layer is its path: the package under ``clusterlab`` it sits in. Beside the four, the
top level holds only ``__init__``, ``__main__`` (the command line, so course) and private helpers
(``_checks``: input checks every layer uses, below all of them). Every module is parsed with
``ast`` (no import runs), and every import in it is an arrow, at the top of the module or inside
a function alike: an import inside a function runs as surely as one at the top, only later. The
last tests run the same checker on made-up graphs and show that it reports an upward arrow, a
circle, JAX in an analytical module and a module outside the four packages.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = "clusterlab"
ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "lib" / PACKAGE

HELPERS, CATALOG, ANALYTICAL, DEVICE, COURSE = 0, 1, 2, 3, 4
LAYER_NAMES = {HELPERS: "private helpers", CATALOG: "catalog", ANALYTICAL: "analytic",
               DEVICE: "device", COURSE: "course"}
PACKAGES = {"catalog": CATALOG, "analytic": ANALYTICAL, "device": DEVICE, "course": COURSE,
            "__main__": COURSE}
# Libraries built on JAX: none may be imported below the device layer.
JAX_LIBRARIES = frozenset({"jax", "jaxlib", "optax", "orbax", "grain", "flax", "equinox", "chex"})


def module_name(path: Path, root: Path = SOURCE) -> str:
    """``lib/clusterlab/analytic/costmodel/_nccl.py`` -> ``clusterlab.analytic.costmodel._nccl`` (a package's
    ``__init__.py`` is the package)."""
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
              modules: set[str]) -> set[str]:
    """The absolute names one import statement brings in: a module of the library where it
    names one (``from clusterlab import hlo`` is ``clusterlab.device.hlo``), else what it names."""
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
    """The layer of a module of the library: its package under ``clusterlab``, or the private
    helpers' for a top-level ``_name`` (``None``: the package root, or a module outside the four
    packages)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in PACKAGES:
        return PACKAGES[parts[1]]
    return HELPERS if len(parts) == 2 and parts[1].startswith("_") else None


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Modules of the library outside the four packages (and not a private helper)."""
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
    """Each import of a JAX library by a catalog, analytical or private helper module."""
    return [f"{module} ({LAYER_NAMES[layer_of(module)]}) imports {target}"
            for module, targets in sorted(graph.items())
            if layer_of(module) is not None and layer_of(module) < DEVICE
            for target in sorted(targets & JAX_LIBRARIES)]


# --- the library ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_is_in_a_layer_package(graph):
    assert unplaced(graph) == [], ("move these modules into catalog/, analytic/, device/ or "
                                   "course/ (the root __init__ says what each holds)")


def test_the_top_level_holds_the_four_packages_and_nothing_public():
    entries = {p.name for p in SOURCE.iterdir() if p.name != "__pycache__"}
    public = {name for name in entries if not name.startswith("_")}
    assert public == {"catalog", "analytic", "device", "course"}, entries


def test_nothing_imports_a_higher_layer(graph):
    assert upward_arrows(graph) == []


def test_there_is_no_import_circle(graph):
    assert circles(graph) == []


def test_the_catalog_and_the_analytical_models_import_no_jax(graph):
    assert jax_below_devices(graph) == []


def test_the_graph_sees_function_level_and_package_imports(graph):
    # What the checks above rest on, read from the real modules: an import inside a function
    # (grading's JAX, for code exercises), a name imported from a package that is a module
    # (check's "from clusterlab.course import answers, grading"), a submodule of a package.
    assert "jax" in graph["clusterlab.course.grading"]
    assert {"clusterlab.course.answers",
            "clusterlab.course.grading"} <= graph["clusterlab.course.check"]
    assert any(m.startswith("clusterlab.analytic.costmodel.") for m in graph)
    assert layer_of("clusterlab.analytic.costmodel._nccl") == ANALYTICAL
    assert layer_of("clusterlab._checks") == HELPERS


def _top_level_imports(path: Path) -> set[str]:
    """The top-level names of what a module imports when it loads (not inside a function)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def _distribution(requirement: str) -> str:
    """``"jax>=0.10"`` -> ``"jax"``: the name a requirement installs."""
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop)[0]
    return requirement.lower()


# Import names that differ from the distribution that installs them.
IMPORT_NAME = {"ipython": "IPython", "orbax-checkpoint": "orbax", "jupyter-book": None,
               "sphinx-exercise": None, "sphinxcontrib-bibtex": None,
               "sphinx-mathjax-offline": None}


def test_what_the_layers_import_at_load_time_is_declared():
    # B2 of the outside review: pyproject declared jax, numpy, matplotlib, networkx and tqdm, but
    # modules imported optax, scipy, IPython and nbformat when they loaded. The catalog and the
    # analytical models may load only the base install; device and course modules may also load
    # their own extra. (An import inside a function is how a module uses an extra it rarely needs:
    # tables' IPython, grading's nbformat.)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {layer: {IMPORT_NAME.get(_distribution(r), _distribution(r))
                        for r in requirements}
                for layer, requirements in project["optional-dependencies"].items()}
    base = {_distribution(r) for r in project["dependencies"]}
    allowed = {CATALOG: base, ANALYTICAL: base, HELPERS: base,
               DEVICE: base | declared["device"], COURSE: base | declared["course"]}
    undeclared = []
    for path in sorted(SOURCE.rglob("*.py")):
        module = module_name(path)
        layer = layer_of(module)
        if layer is None:
            continue
        for name in sorted(_top_level_imports(path)):
            if name in sys.stdlib_module_names or name in (PACKAGE, "__future__"):
                continue
            # a course module may load device code (the extras are installed together)
            if layer == COURSE and name in allowed[DEVICE]:
                continue
            if name not in allowed[layer]:
                undeclared.append(f"{module} ({LAYER_NAMES[layer]}) loads {name}")
    assert undeclared == [], "declare these in pyproject.toml, or import them where used"


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
        "catalog/__init__.py": "", "device/__init__.py": "",
        "catalog/hardware.py": ("def gpu():\n    from clusterlab.device import bench\n"
                                "    return bench\n"),
        "device/bench.py": "import numpy\n",
    })
    assert upward_arrows(fake) == [
        "clusterlab.catalog.hardware (catalog) imports clusterlab.device.bench (device)"]


def test_a_circle_through_a_package_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {
        "analytic/__init__.py": "",
        "analytic/costmodel/__init__.py": "from .traffic import bytes_moved\n",
        "analytic/costmodel/traffic.py": "from clusterlab.analytic.fabric import steps\n",
        "analytic/fabric.py": "from clusterlab.analytic import costmodel\n",
    })
    assert upward_arrows(fake) == []  # all three are analytical: only the circle is wrong
    assert circles(fake) == [["clusterlab.analytic.costmodel",
                              "clusterlab.analytic.costmodel.traffic",
                              "clusterlab.analytic.fabric"]]


def test_jax_in_an_analytical_module_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {"analytic/__init__.py": "", "device/__init__.py": "",
                                    "analytic/memory.py": "import jax.numpy as jnp\n",
                                    "device/devices.py": "import jax\n"})
    assert jax_below_devices(fake) == ["clusterlab.analytic.memory (analytic) imports jax"]


def test_a_module_outside_the_four_packages_is_reported(tmp_path):
    fake = _fake_library(tmp_path, {"profile_new.py": "import numpy\n",
                                    "_private.py": "import math\n"})
    assert unplaced(fake) == ["clusterlab.profile_new"]
