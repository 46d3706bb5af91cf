"""The references are out of reach (issue 37, item 2), graded through grading.main as
``make grade`` calls it, on lab 02's ring assignment (keys/lab02.py).

- In the sandbox the library's own ring functions refuse a notebook's answer, handed over as
  the answer itself or called after a reload of their module; the honest submission graded after
  the one calling them keeps its marks, and a submission that uses the library's ring all-reduce
  (which calls them from inside the library) is graded as usual.
- The same for labs 04, 13 and 14 in one batch: the library's sequence-parallel matmuls, the
  layer's routing, masks and combine, and its ring attention (which JAX, not the notebook, calls
  inside ``shard_map``) refuse the answers that call them, while the lab's own cells that use
  them run; each honest submission after a cheat keeps its marks. A notebook that patches the
  guard away is refused by the grader, which reads the library's frames in its program.
- The hidden inputs are drawn afresh each run: a table of outputs built for one run's seed
  passes that run (the control that the table is right) and fails the next.
- Every key's code exercises: each names the library's functions to withhold (the sandbox can
  guard each), or a comment after its ``grading.code`` call says why it has none; and its hidden
  inputs differ between two run seeds (labs 08 and 10, model configurations, excepted).
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import importlib.util
import os
from pathlib import Path

import jax
import nbformat
import numpy as np
import pytest

from assignment_support import KEYS, code_after, key_module, lab_sources
from clusterlab.course import grading, sandbox
from conftest import fixture_submission
from test_grading_security import SMALL as SECURITY_LIMITS

# The security tests' limits, with room for threads: RLIMIT_NPROC counts every process and
# thread of the user nobody on the machine, and a kernel with 8 JAX devices runs about 40, so
# a sandbox beside another test's (the suite runs two workers) could not start its threads and
# died of SIGABRT under the security tests' 96.
SMALL = dataclasses.replace(SECURITY_LIMITS, processes=sandbox.Limits().processes)

IMPORTS = ("import jax\nimport jax.numpy as jnp\nimport numpy as np\n"
           "from clusterlab.course import check\n"
           "from clusterlab.device import collectives, devices\ndevices.setup(8)")
RING_SOLUTIONS = lab_sources("02", ["lab02-reduce-scatter", "lab02-all-gather"])[1::2]
HONEST = [IMPORTS, *RING_SOLUTIONS]
# A cell's time limit in these batches: the grader's default, since an honest lab 14 solution
# compiling its ring on 8 devices took over 120 s beside three loaded test workers.
NOTEBOOK_TIMEOUT_S = 600
CALLS_THE_LIBRARY = [
    IMPORTS,
    "check.answer('lab02.3', collectives.ring_reduce_scatter)   # the library's, handed over",
    "import importlib\ncollectives = importlib.reload(collectives)  # a fresh copy of the module\n"
    "def ring_all_gather(chunk, axis_name):\n"
    "    return collectives.ring_all_gather(chunk, axis_name)\n"
    "check.answer('lab02.4', ring_all_gather)",
    # the library's all-reduce calls both from inside the library: that still runs
    "mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ('i',))\n"
    "print('all-reduce', jax.jit(jax.shard_map(\n"
    "    lambda b: collectives.ring_all_reduce(b, 'i'), mesh=mesh, in_specs=jax.P('i'),\n"
    "    out_specs=jax.P('i'), check_vma=False))(jnp.ones(16)).sum())\n"
    "check.answer('lab02.1', 6)"]
WITHHELD = ("is the course's own solution to an exercise being graded; while grading it refuses "
            "to run for a notebook. Call the function you wrote.")


def _points(grades: Path) -> dict[tuple[str, str], int]:
    with open(grades) as handle:
        return {(r[0], r[1]): int(r[2]) for r in list(csv.reader(handle))[1:]}


def test_the_librarys_ring_refuses_a_notebook_and_the_next_keeps_its_marks(tmp_path, capsys):
    cheat = fixture_submission(tmp_path / "cheat", CALLS_THE_LIBRARY, "02-ring.ipynb")
    honest = fixture_submission(tmp_path / "honest", HONEST, "02-ring.ipynb")
    grades = tmp_path / "grades.csv"
    grading.main([str(cheat), str(honest)], key_dir=str(KEYS), timeout_s=NOTEBOOK_TIMEOUT_S,
                 csv_path=str(grades), limits=SMALL)
    out = capsys.readouterr().out
    print(out)
    name = "clusterlab.device.collectives.ring_{}"
    assert (f"  lab02.3  ✗ ring reduce-scatter: your function raised ReferenceWithheld: "
            f"{name.format('reduce_scatter')} {WITHHELD}") in out
    assert (f"  lab02.4  ✗ ring all-gather: your function raised ReferenceWithheld: "
            f"{name.format('all_gather')} {WITHHELD}") in out
    points = _points(grades)
    assert points[("cheat", "lab02.3")] == points[("cheat", "lab02.4")] == 0
    assert points[("cheat", "lab02.1")] == 1    # its all-reduce cell ran to check.answer
    assert points[("honest", "lab02.3")] == points[("honest", "lab02.4")] == 1


# ---- labs 04, 13, 14: references JAX calls inside shard_map, and the lab's own cells ----------

LAB_IMPORTS = (IMPORTS + "\nfrom clusterlab.analytic import costmodel, moe\n"
               "from clusterlab.catalog import hardware\n"
               "from clusterlab.device.parallel import context, experts, tensor")
# cells as the labs run them (each library function here is withheld while its lab is graded),
# each then recording a value exercise that is not a recipe: it scores only if the cell ran
LAB_CELLS = {
    "04": "mesh = devices.mesh((2,), ('model',), jax.devices()[:2])\n"
          "print(tensor.make_column_matmul(mesh, 'model', overlap=True)(jnp.ones((4, 2)),\n"
          "                                                           jnp.ones((2, 4))).shape)\n"
          + lab_sources("04", ["lab04-overlap"])[1],
    "13": "routing = experts.route(jnp.eye(4), jnp.eye(4)[jnp.arange(8) % 4], top_k=1,\n"
          "                        capacity=2)\n"
          "print(experts.DISPATCH_COMBINE.combine(jnp.ones((4, 2, 3)),\n"
          "                                       experts.masks(routing, 4, 2)).shape)\n"
          + lab_sources("13", ["lab13-deepseek-bytes"])[1],
    "14": "ring = context.make_ring_attention(devices.mesh((2,), ('seq',), jax.devices()[:2]),\n"
          "                                  'seq', causal=True)\n"
          "print(ring(*[jnp.ones((1, 4, 1, 2))] * 3)[0].shape)\n"
          + lab_sources("14", ["lab14-ring-bytes"])[1]}
# lab 04's also patches the sandbox's guard for the block (it runs in the notebook's process)
# and hands over the library's block (its f left out: the grader's x arrives split), which the
# checker alone passes: the grader reads the block's frames in the program and refuses it
GUARD_PATCHED = ("from clusterlab.course import submission\n"
                 "guard = submission.refuse_unless_library\n"
                 "submission.refuse_unless_library = lambda name: (\n"
                 "    None if name.endswith('.mlp_block') else guard(name))\n"
                 "def megatron_mlp_forward(x, w1, b1, w2, b2, axis_name):\n"
                 "    block = {'w1': w1[0], 'b1': b1[0], 'w2': w2[0], 'b2': b2[0]}\n"
                 "    ops = tensor.MegatronOps(lambda v, axis: v, tensor.MEGATRON.reduce)\n"
                 "    return tensor.mlp_block(block, x[0], axis_name, ops=ops)[None]\n"
                 "check.answer('lab04.3', megatron_mlp_forward)\n")
LAB_CHEATS = {
    "04": GUARD_PATCHED + "def sequence_parallel_mlp(x, w1, b1, w2, b2, axis_name):\n"
          "    hidden = jax.nn.relu(tensor.all_gather_matmul(x, w1[0], axis_name) + b1[0])\n"
          "    return x + tensor.matmul_reduce_scatter(hidden, w2[0], axis_name) + b2[0]\n"
          "check.answer('lab04.6', sequence_parallel_mlp)",
    # scores that make the course's router pick exactly these experts, best first: its slots,
    # masks and combine then do the whole exercise
    "13": "def combine_from_experts(expert_out, expert, weight):\n"
          "    n_experts, capacity, _ = expert_out.shape\n"
          "    k = expert.shape[1]\n"
          "    x = sum((k - j) * 30.0 * jax.nn.one_hot(expert[:, j], n_experts)\n"
          "            for j in range(k))\n"
          "    routing = experts.route(jnp.eye(n_experts), x, top_k=k, capacity=capacity,\n"
          "                            renormalize=False)._replace(weight=weight)\n"
          "    return experts.DISPATCH_COMBINE.combine(\n"
          "        expert_out, experts.masks(routing, n_experts, capacity))\n"
          "check.answer('lab13.5', combine_from_experts)",
    "14": "def ring_attention_backward(q, k, v, out, lse, d_out, axis_name):\n"
          "    _, vjp = jax.vjp(lambda q, k, v: context.ring_attention(\n"
          "        q[None], k[None], v[None], axis_name, causal=True)[0][0], q, k, v)\n"
          "    return vjp(d_out)\n"
          "check.answer('lab14.4', ring_attention_backward)"}
LAB_HONEST = {
    "04": lab_sources("04", ["lab04-sequence-parallel"])[1::2],
    "13": lab_sources("13", ["lab13-combine"])[1::2],
    "14": [code_after(nbformat.read(next((KEYS.parent / "labs").glob("14-*.ipynb")),
                                    as_version=4), "`with_backward(backward, axis)`"),
           lab_sources("14", ["lab14-ring-backward"])[1]]}
# SMALL's limits but CPU time for a lab cell that compiles a ring (about 6 s with JAX's start)
LAB_LIMITS = dataclasses.replace(SMALL, cpu_s=30)
# the code exercise each cheat answers, what it calls first, and the value its lab cell records
LAB_REFUSED = {"04": ("lab04.6", "sequence-parallel MLP block",
                      "clusterlab.device.parallel.tensor.all_gather_matmul", "lab04.5"),
               "13": ("lab13.5", "combine", "clusterlab.device.parallel.experts.route", "lab13.2"),
               "14": ("lab14.4", "ring attention's backward",
                      "clusterlab.device.parallel.context.ring_attention", "lab14.2")}


def test_labs_04_13_14_withhold_what_jax_calls_and_the_next_keeps_its_marks(tmp_path, capsys):
    # the three keys alone in a folder with no labs/ beside it: their recipes (values the
    # instructor's lab computes) fail at once instead of running three labs; this test reads
    # code exercises and values that are not recipes only
    keys = tmp_path / "keys"
    keys.mkdir()
    for lab in LAB_REFUSED:
        (keys / f"lab{lab}.py").write_text((KEYS / f"lab{lab}.py").read_text())
    batch = []
    for lab in LAB_REFUSED:
        batch += [fixture_submission(tmp_path / f"cheat{lab}",
                                     [LAB_IMPORTS, LAB_CELLS[lab], LAB_CHEATS[lab]],
                                     f"{lab}-lab.ipynb"),
                  fixture_submission(tmp_path / f"honest{lab}", [LAB_IMPORTS, *LAB_HONEST[lab]],
                                     f"{lab}-lab.ipynb")]
    grades = tmp_path / "grades.csv"
    grading.main([str(path) for path in batch], key_dir=str(keys), timeout_s=NOTEBOOK_TIMEOUT_S,
                 csv_path=str(grades), limits=LAB_LIMITS)
    out = capsys.readouterr().out
    print(out)
    points = _points(grades)
    for lab, (exercise, name, first_called, cell_value) in LAB_REFUSED.items():
        assert (f"  {exercise}  ✗ {name}: your function raised ReferenceWithheld: "
                f"{first_called} {WITHHELD}") in out, lab
        assert points[(f"cheat{lab}", exercise)] == 0
        assert points[(f"cheat{lab}", cell_value)] == 1, f"lab {lab}'s own cell did not run"
        assert points[(f"honest{lab}", exercise)] == 1, f"the honest lab {lab} lost its marks"
    assert ("  lab04.3  ✗ Megatron MLP forward: its program was built by "
            "clusterlab.device.parallel.tensor.mlp_block, the course's own solution to this "
            "exercise, which grading withholds. Call the function you wrote.") in out
    assert points[("cheat04", "lab04.3")] == 0


def test_a_program_without_call_stacks_is_refused_where_references_are_withheld():
    # the guard-patched cheat's block, judged here (no sandbox, so no guard): with JAX's call
    # stacks in its locations the grader names the block; exported without them (a notebook can
    # flip the option, and the block's name is then gone) it is refused for that
    from clusterlab.device.parallel import tensor

    def library_block(x, w1, b1, w2, b2, axis_name):
        block = {"w1": w1[0], "b1": b1[0], "w2": w2[0], "b2": b2[0]}
        ops = tensor.MegatronOps(lambda v, axis: v, tensor.MEGATRON.reduce)
        return tensor.mlp_block(block, x[0], axis_name, ops=ops)[None]

    key = grading.load_key(KEYS / "lab04.py")
    assert grading.judge(key, "lab04.3", library_block, {}).line.startswith(
        "✗ Megatron MLP forward: its program was built by "
        "clusterlab.device.parallel.tensor.mlp_block")
    option = "jax_include_full_tracebacks_in_locations"
    jax.config.update(option, False)
    try:
        verdict = grading.judge(key, "lab04.3", library_block, {})
    finally:
        jax.config.update(option, True)
    print(verdict.line)
    assert verdict.line.startswith("✗ Megatron MLP forward: its program carries no call stacks")


def test_a_program_exported_in_a_cell_still_names_the_reference():
    # a cell may run the references (the lab's own cells do): lab 13's cheat exported there at
    # the hidden shapes (the request names them), the answer only calling those programs; the
    # exported programs keep their call stacks, so the grader still sees the routing
    cheat = {}
    exec(LAB_IMPORTS.replace("devices.setup(8)", "") + "\n" + LAB_CHEATS["13"].replace(
        "check.answer('lab13.5', combine_from_experts)", ""), cheat)
    key = grading.load_key(KEYS / "lab13.py")
    exported = {}
    for export in key["lab13.5"].exports:
        shapes = tuple(tuple(shape) for shape, _ in export.args)
        exported[shapes] = jax.export.export(jax.jit(cheat["combine_from_experts"]))(
            *(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in export.args))

    def combine_from_experts(expert_out, expert, weight):
        program = exported[(expert_out.shape, expert.shape, weight.shape)]
        return program.call(expert_out, expert, weight)

    verdict = grading.judge(key, "lab13.5", combine_from_experts, {})
    print(verdict.line)
    assert verdict.line.startswith("✗ combine: its program was built by "
                                   "clusterlab.device.parallel.experts.route")


def _table_submission(folder: Path, seed: int) -> Path:
    """A reduce-scatter that returns the hidden tests' outputs for the inputs of ``seed``'s run,
    looked up by device count and block size, with the p - 1 permutes the structure check reads:
    what a student holding the key's cases and an earlier report's seed could hand in."""
    lab02 = key_module("lab02")
    previous = os.environ.get(grading.SEED_ENV)
    os.environ[grading.SEED_ENV] = str(seed)
    try:
        table = {}
        for case in lab02._CASES:
            x = np.asarray(jax.random.normal(jax.random.key(grading.hidden_seed(case.seed)),
                                             (case.devices * case.block,)))
            table[(case.devices, case.block)] = x.reshape(case.devices, -1).sum(0).tolist()
    finally:
        os.environ.pop(grading.SEED_ENV) if previous is None else os.environ.update(
            {grading.SEED_ENV: previous})
    lookup = (f"TABLE = {table!r}\n"
              "def ring_reduce_scatter(block, axis_name):\n"
              "    p, n = jax.lax.axis_size(axis_name), block.shape[0]\n"
              "    rows = jnp.asarray(TABLE[(p, n)], jnp.float32).reshape(p, n // p)\n"
              "    me = jax.lax.axis_index(axis_name)\n"
              "    partial = rows[(me - 1) % p] + 0.0 * block[: n // p]\n"
              "    for _ in range(1, p):\n"
              "        partial = jax.lax.ppermute(partial, axis_name,\n"
              "                                   [(i, (i + 1) % p) for i in range(p)])\n"
              "    return partial\n"
              "check.answer('lab02.3', ring_reduce_scatter)")
    return fixture_submission(folder, [IMPORTS, lookup], "02-table.ipynb")


def test_a_table_of_one_runs_outputs_fails_the_next_run(tmp_path, capsys):
    seed = 20261206
    table = _table_submission(tmp_path / "table", seed)
    grades = tmp_path / "grades.csv"
    grading.main([str(table)], key_dir=str(KEYS), timeout_s=NOTEBOOK_TIMEOUT_S,
                 csv_path=str(grades), limits=SMALL, seed=seed)
    first = capsys.readouterr().out
    assert first.splitlines()[0] == (f"hidden inputs from seed {seed} "
                                     f"(--seed {seed} draws them again)")
    assert "  lab02.3  ✓ ring reduce-scatter is correct." in first   # the table is right for it
    grading.main([str(table)], key_dir=str(KEYS), timeout_s=NOTEBOOK_TIMEOUT_S,
                 csv_path=str(grades), limits=SMALL)
    second = capsys.readouterr().out
    print(first, second)
    assert ("  lab02.3  ✗ ring reduce-scatter: reduce-scatter on 2 devices, 10 values each: "
            "its result") in second
    assert _points(grades)[("02-table", "lab02.3")] == 0


# ---- every key: references declared or explained, hidden inputs fresh each run ---------------

# code exercises whose hidden inputs are model configurations, not random draws: their expected
# values come from the library's model of each configuration, so there is nothing to redraw
_FIXED_INPUTS = {"lab08.4": "GEMM shapes of named layers on catalog GPUs",
                 "lab10.3": "layouts whose order the planted bugs' tests rely on"}
_NO_REFERENCES = "# no references:"


class _Stop(BaseException):
    """Raised by a stand-in program the first time a checker uses it: the inputs are drawn.
    Not an Exception, so that the judge does not turn it into a verdict."""


class _StandIn:
    """In place of a submission's program: any use stops the checker, whose frames then hold
    the hidden inputs it drew."""

    def __call__(self, *args):
        raise _Stop

    collective_ops = collectives = place = __call__

    @property
    def exported(self):
        raise _Stop


def _code_calls(key_path: Path) -> dict[str, ast.Call]:
    """Each ``grading.code(...)`` call of a key by exercise id (a KEY dict entry, or
    ``KEY["labNN.M"] = grading.code(...)``)."""
    calls = {}
    for node in ast.walk(ast.parse(key_path.read_text())):
        pairs = (zip(node.keys, node.values) if isinstance(node, ast.Dict) else
                 [(node.targets[0].slice, node.value)] if isinstance(node, ast.Assign)
                 and isinstance(node.targets[0], ast.Subscript) else [])
        for key, value in pairs:
            if (isinstance(key, ast.Constant) and isinstance(value, ast.Call)
                    and ast.unparse(value.func) == "grading.code"):
                calls[key.value] = value
    return calls


def _drawn_inputs(key_path: Path, exercise_id: str, seed: int) -> list[np.ndarray]:
    """The arrays in the checker's frames when it first uses a program, the key loaded afresh
    under run seed ``seed`` (a key may draw its cases when it loads)."""
    previous = os.environ.get(grading.SEED_ENV)
    os.environ[grading.SEED_ENV] = str(seed)
    try:
        spec = importlib.util.spec_from_file_location(f"fresh_{key_path.stem}_{seed}", key_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        exercise = module.KEY[exercise_id]
        with pytest.raises(_Stop) as stopped:
            exercise.judge([_StandIn() for _ in exercise.exports], None)
    finally:
        os.environ.pop(grading.SEED_ENV) if previous is None else os.environ.update(
            {grading.SEED_ENV: previous})
    arrays, frame = [], stopped.tb
    while frame is not None:
        if frame.tb_frame.f_code.co_filename == str(key_path):
            arrays += [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(
                list(frame.tb_frame.f_locals.values()))
                if isinstance(leaf, (np.ndarray, jax.Array)) and np.size(leaf) > 1
                and not isinstance(leaf, jax.core.Tracer)]   # a jitted lambda's arguments
        frame = frame.tb_next
    return arrays


def _keys_with_code() -> list[Path]:
    return [path for path in sorted(KEYS.glob("lab*.py")) if _code_calls(path)]


@pytest.mark.parametrize("key_path", _keys_with_code(), ids=lambda path: path.stem)
def test_each_code_exercise_withholds_the_library_and_draws_fresh_inputs(key_path, tmp_path):
    calls, lines = _code_calls(key_path), key_path.read_text().splitlines()
    key = grading.load_key(key_path)
    assert set(calls) == {i for i, exercise in key.items() if exercise.exports}
    for exercise_id, call in calls.items():
        references = key[exercise_id].references
        if references:   # each names a function the sandbox can guard
            assert sandbox.withheld_binds(references, tmp_path), exercise_id
        else:            # or the line after the call says why the library has none
            after = next(line.strip() for line in lines[call.end_lineno:] if line.strip())
            assert after.startswith(_NO_REFERENCES), (
                f"{exercise_id} declares no references and no {_NO_REFERENCES!r} comment after "
                f"its grading.code call (line {call.lineno}): name the library's function, or "
                "say why it has none.")
        first, second = (_drawn_inputs(key_path, exercise_id, seed) for seed in (11, 12))
        assert first and len(first) == len(second), exercise_id
        same = all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(first, second))
        assert same == (exercise_id in _FIXED_INPUTS), (
            f"{exercise_id}: two run seeds drew {'the same' if same else 'different'} hidden "
            "inputs: draw them from grading.hidden_seed (or, for fixed model configurations, "
            "list the exercise in _FIXED_INPUTS).")
        print(f"✓ {exercise_id}: references {list(references) or 'none (said why)'}; "
              f"{len(first)} arrays, {'fixed by design' if same else 'fresh per run seed'}")
