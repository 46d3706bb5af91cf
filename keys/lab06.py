"""Answer key of lab 06, sharded data parallelism (instructor-only: student copies leave keys/
out).

``lab06.4`` is the FSDP / ZeRO-3 assignment: the student's ``fsdp_step(flat_shard, x, y,
axis_name)`` runs inside ``shard_map`` over a ``"data"`` axis of p devices; device j holds the
j-th of p equal slices of every block's flat parameter (``sharded.flatten_blocks``' rows, laid
out f32[p, L, F/p]) and the j-th shard of the batch, and returns its slice after one step of
plain SGD (learning rate ``LEARNING_RATE`` = 0.1, so the reference is exact). The hidden tests
run it on 2, 4 and 8 devices, with widths, depths and batches the lab never shows, against one
device's SGD step on the whole batch, and read the compiled program: all-gathers and
reduce-scatters only (no all-reduce), two gathers per reduce-scatter, and the bytes of ZeRO-3's
formula, ``3 (p - 1)/p`` of the parameters' bytes per device
(:func:`clusterlab.analytic.costmodel.sharded_data_parallel_bytes_per_step`).

``lab06.5`` is ZeRO-1 in mixed precision: the student's ``zero1_step(params, master, m, v, x, y,
axis_name)`` holds the whole model in bf16 (bf16[1, L, F], the same on every device), its slice
of the fp32 master weights and of Adam's moments (f32[1, L, F/p], lab06.4's columns) and its
shard of the batch; it returns all four after one Adam step (``adam_update`` of the lab, no
bias correction). The hidden tests run it on 3, 4 and 6 devices (the lab shows 2 and 8) and
compare with one device's step on the whole batch, gradient in bf16, update in fp32: the
update's normwise relative difference below 1e-2 (bf16 sums in another order: 2e-4 to 4e-4 on
these cases; a master weight rounded to bf16: 0.6 to 0.8). They read the program as lowered (XLA:CPU in jax 0.10.2 widens
bf16 collectives to f32 when it compiles them): one bf16 reduce-scatter and one bf16
all-gather, ZeRO-1's ``2 (p - 1)/p`` of the bf16 parameters' bytes; and the compiled program's
memory: its temporaries below one whole copy of the fp32 optimizer state, 12 bytes a parameter.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from clusterlab.analytic import costmodel, memory
from clusterlab.course import grading
from clusterlab.device import hlo, models
from clusterlab.device.parallel import sharded

LEARNING_RATE = 0.1              # the lab's fsdp_step takes plain SGD steps of this size
_AXIS = "data"


def _stage3_bytes_on_16(ns):
    # the lab's fp32 parameters and Adam moments, sharded 16 ways, plus Adam's 4-byte counter
    return memory.training_memory_per_device(ns["n_params"], 16, 3, bytes_param=4, bytes_grad=0,
                                             optimizer_bytes_per_param=8) + 4


def _all_gathers(ns):
    # counted in the compiled stage-3 step the student cell builds (5 blocks, 2 devices)
    sdp = ns["sdp_2"]
    ops = hlo.executed_collectives(sdp.step, ns["flat_2"], ns["state_2"],
                                           *sdp.place_batch(*ns["batches"][0]))
    return hlo.summarize(ops)["all-gather"].n_ops


class _Case(NamedTuple):
    """One hidden case: p devices, an MLP of n_blocks blocks (D, H), a global batch."""

    devices: int
    n_blocks: int
    d_model: int
    d_hidden: int
    batch: int
    seed: int

    @property
    def flat_size(self) -> int:
        return 2 * self.d_model * self.d_hidden + self.d_hidden + self.d_model   # F

    @property
    def name(self) -> str:
        return (f"SGD step on {self.devices} devices, {self.n_blocks} block(s) of D = "
                f"{self.d_model}, H = {self.d_hidden}, batch {self.batch}")


# the lab shows D = 64, H = 256, 3 blocks, batch 64 on 8 devices; none of these
_CASES = (_Case(2, 2, 8, 16, 12, 601), _Case(4, 3, 4, 12, 8, 602), _Case(8, 2, 8, 16, 24, 603))


def _by_device(flat: np.ndarray, p: int) -> np.ndarray:
    """f32[L, F] -> f32[p, L, F/p]: row j holds device j's slice of every block."""
    n_blocks, size = flat.shape
    return np.asarray(flat).reshape(n_blocks, p, size // p).transpose(1, 0, 2)


def _inputs(case: _Case) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """The blocks, their slices f32[p, L, F/p], and the batch x, y: f32[B, D]."""
    blocks = models.init_mlp(jax.random.key(grading.hidden_seed(case.seed)), d_model=case.d_model,
                             d_hidden=case.d_hidden, n_blocks=case.n_blocks)
    x, y = models.synthetic_regression(jax.random.key(grading.hidden_seed(case.seed + 1)),
                                       n_samples=case.batch, d_model=case.d_model)
    flat, _ = sharded.flatten_blocks(blocks)
    return blocks, _by_device(np.asarray(flat), case.devices), np.asarray(x), np.asarray(y)


def _args(case: _Case) -> list[tuple[tuple[int, ...], str]]:
    """The global (shape, dtype) of each input, as the export asks for them."""
    slices = (case.devices, case.n_blocks, case.flat_size // case.devices)
    batch = (case.batch, case.d_model)
    return [(slices, "float32"), (batch, "float32"), (batch, "float32")]


def _require_zero3_traffic(test: str, program: grading.Program, args: list,
                           case: _Case) -> None:
    """Refuse unless the program runs all-gathers and reduce-scatters only, two gathers per
    reduce-scatter, sending ZeRO-3's 3 (p - 1)/p of the parameters' bytes per device."""
    ops = program.collective_ops(*args)
    counts = {kind: s.n_ops for kind, s in hlo.summarize(ops).items()}
    if set(counts) != {"all-gather", "reduce-scatter"}:
        raise grading.Refused(
            f"{test}: its program runs {counts}; ZeRO-3 runs all-gathers and reduce-scatters "
            "only. Hint: gather each block's slices with jax.lax.all_gather where the block "
            "runs and let its gradient come back reduce-scattered (the all-gather's backward, "
            "or jax.lax.psum_scatter); a psum of the whole gradient is plain data parallelism.")
    n_params = case.n_blocks * case.flat_size
    sent = sharded.sent_bytes_per_device(ops, case.devices)
    formula = costmodel.sharded_data_parallel_bytes_per_step(n_params, 4, case.devices, 3)
    if counts["all-gather"] != 2 * counts["reduce-scatter"] or not np.isclose(sent, formula):
        raise grading.Refused(
            f"{test}: its program runs {counts}, sending {sent:,.0f} B per device; ZeRO-3 "
            f"gathers the parameters forward and again backward and reduce-scatters their "
            f"gradient once: 3 (p - 1)/p x {4 * n_params:,} B = {formula:,.0f} B. Hint: gather "
            "inside a jax.checkpoint'ed block, so that the backward pass gathers again instead "
            "of keeping the whole parameters.")


def _check_fsdp_step(programs) -> None:
    for program, case in zip(programs, _CASES):
        blocks, slices, x, y = _inputs(case)
        gradient, _ = sharded.flatten_blocks(models.reference_gradients(blocks, x, y))
        expected = slices - LEARNING_RATE * _by_device(np.asarray(gradient), case.devices)
        updated = program(slices, x, y)                           # f32[p, L, F/p]
        grading.require_close(
            f"{case.name}: the updated slices", updated, expected,
            hint="return this device's slice, f32[1, L, F/p], minus LEARNING_RATE times its "
                 "gradient of the mean over the WHOLE batch: the reduce-scatter sums the p "
                 "devices' gradients of their own examples' means.")
        _require_zero3_traffic(f"{case.name}: its collectives", program, [slices, x, y], case)


# --- lab06.5: ZeRO-1, bf16 compute, fp32 master weights ------------------------------------

ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS = 1e-3, 0.9, 0.999, 1e-8      # the lab's adam_update
_UPDATE_RTOL = 1e-2
_OPTIMIZER_BYTES = 12          # fp32 master weight, m and v, bytes a parameter


def _adam_update(master, m, v, grad):
    """The lab's adam_update, in NumPy fp32."""
    m = ADAM_B1 * m + (1 - ADAM_B1) * grad
    v = ADAM_B2 * v + (1 - ADAM_B2) * grad**2
    return master - ADAM_LR * m / (np.sqrt(v) + ADAM_EPS), m, v


class _MixedCase(_Case):
    """One hidden ZeRO-1 case: the fields of :class:`_Case`; F divisible by p."""

    @property
    def name(self) -> str:
        return (f"ZeRO-1 Adam step on {self.devices} devices, {self.n_blocks} block(s) of D = "
                f"{self.d_model}, H = {self.d_hidden}, batch {self.batch}")

    def args(self) -> list[tuple[tuple[int, ...], str]]:
        slices = ((self.devices, self.n_blocks, self.flat_size // self.devices), "float32")
        batch = ((self.batch, self.d_model), "float32")
        return [((self.devices, self.n_blocks, self.flat_size), "bfloat16"),
                slices, slices, slices, batch, batch]


# the lab shows 8 devices (and 2 in exercise 3); F = 162 and 348 split 3, 4 and 6 ways
_MIXED_CASES = (_MixedCase(3, 2, 6, 12, 12, 651), _MixedCase(4, 3, 8, 20, 8, 652),
                _MixedCase(6, 2, 8, 20, 24, 653))


def _bf16_gradient(case: _MixedCase, master: np.ndarray, x: np.ndarray,
                   y: np.ndarray) -> np.ndarray:
    """f32[L, F]: one device's gradient of the whole batch's mean squared error with respect
    to the bf16 parameters, computed in bf16, in sharded.flatten_blocks' layout."""
    shapes = {"w1": (case.d_model, case.d_hidden), "b1": (case.d_hidden,),
              "w2": (case.d_hidden, case.d_model), "b2": (case.d_model,)}
    unravel = sharded.flatten_blocks([{k: np.zeros(s, np.float32) for k, s in shapes.items()}])[1]

    def loss(rows):                                           # rows: bf16[L, F]
        blocks = [jax.tree.map(lambda a: a.astype(jnp.bfloat16), unravel(r)) for r in rows]
        out = models.mlp_forward(blocks, jnp.asarray(x, jnp.bfloat16))
        return jnp.mean((out.astype(jnp.float32) - y) ** 2)

    return np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(master, jnp.bfloat16)), np.float32)


def _mixed_inputs(case: _MixedCase) -> tuple:
    """params bf16[p, L, F] (a copy per device), master, m, v f32[L, F], x, y f32[B, D] and
    the gradient f32[L, F]; weights at init_mlp's scale, moments at the gradient's, so that a
    wrong gradient moves the update."""
    rng = np.random.default_rng(grading.hidden_seed(case.seed))
    shape = (case.n_blocks, case.flat_size)
    master = (rng.normal(size=shape) / np.sqrt(case.d_model)).astype(np.float32)
    x, y = rng.normal(size=(2, case.batch, case.d_model)).astype(np.float32)
    gradient = _bf16_gradient(case, master, x, y)
    scale = np.sqrt(np.mean(gradient**2))
    m = (rng.normal(size=shape) * scale).astype(np.float32)
    v = ((rng.uniform(0.5, 2.0, size=shape) * scale) ** 2).astype(np.float32)
    params = np.broadcast_to(master.astype(jnp.bfloat16), (case.devices, *shape))
    return params, master, m, v, x, y, gradient


def _check_zero1_step(programs) -> None:
    for program, case in zip(programs, _MIXED_CASES):
        params, master, m, v, x, y, gradient = _mixed_inputs(case)
        placed = program.place(params, *(_by_device(a, case.devices) for a in (master, m, v)),
                               x, y)
        lowered = jax.jit(program.exported.call).lower(*placed)     # compiled once, read thrice
        compiled = lowered.compile()
        out = jax.tree.map(np.asarray, compiled(*placed))
        if not isinstance(out, (list, tuple)) or len(out) != 4:
            raise grading.Refused(f"{case.name}: its outputs: expected (params, master, m, v).")
        _require_mixed_values(case, out, master, _adam_update(master, m, v, gradient))
        _require_sharded_state_memory(f"{case.name}: its memory",
                                      hlo.footprint(compiled).temp_bytes, case)
        _require_zero1_traffic(f"{case.name}: its collectives",
                               hlo.collectives_in_text(lowered.as_text(dialect="hlo")),
                               {op.kind for op in hlo.collectives_in_text(compiled.as_text())},
                               case)


def _require_mixed_values(case: _MixedCase, out, master: np.ndarray, expected) -> None:
    """Refuse unless the fp32 master, m and v moved as one device's fp32 Adam step moves them
    (normwise, within _UPDATE_RTOL of the move) and the bf16 parameters are the new master."""
    new_params, *states = out
    for name, got, before, want in zip(("fp32 master weights", "first moments", "second moments"),
                                       states, (master, 0.0, 0.0), expected):
        moved = np.linalg.norm(want - before)
        error = np.linalg.norm(np.asarray(got, np.float64) - _by_device(want, case.devices))
        if got.dtype != np.float32 or not error < _UPDATE_RTOL * moved:
            raise grading.Refused(
                f"{case.name}: the updated {name}: {got.dtype}, off by {error / moved:.2g} of "
                f"the update (allowed {_UPDATE_RTOL:g}). Hint: keep the master weights and "
                "moments in float32 and update them there (a bf16 master loses updates smaller "
                "than its rounding step); divide the reduce-scattered sum by p.")
    own_master = np.asarray(states[0]).transpose(1, 0, 2).reshape(master.shape)   # f32[L, F]
    if new_params.dtype != jnp.bfloat16 or not np.array_equal(
            new_params, np.broadcast_to(own_master.astype(jnp.bfloat16), new_params.shape)):
        raise grading.Refused(
            f"{case.name}: the bf16 parameters: {new_params.dtype}; expected the new fp32 "
            "master rounded to bf16 on every device. Hint: all-gather the rounded slices.")


def _require_sharded_state_memory(test: str, temp_bytes: int, case: _MixedCase) -> None:
    """Refuse unless a device's compiled temporaries stay below one whole copy of the fp32
    optimizer state (master, m, v: 12 bytes a parameter). The solution's are 5 to 8 bytes a
    parameter (the bf16 gradient, XLA:CPU's fp32 copies of the bf16 collectives, activations);
    gathering the fp32 state makes them 20."""
    n_params = case.n_blocks * case.flat_size
    if not temp_bytes < _OPTIMIZER_BYTES * n_params:
        raise grading.Refused(
            f"{test}: {temp_bytes / n_params:.1f} bytes a parameter of temporaries on one "
            f"device; a whole copy of the fp32 master and moments is {_OPTIMIZER_BYTES}. Hint: "
            "update only this device's slice; never gather the master weights or the moments.")


def _require_zero1_traffic(test: str, lowered_ops: list, compiled_kinds: set[str],
                           case: _MixedCase) -> None:
    """Refuse unless the program as lowered runs one bf16 reduce-scatter and one bf16
    all-gather sending ZeRO-1's 2 (p - 1)/p of the bf16 parameters' bytes, and as compiled no
    all-reduce."""
    written = sorted((op.kind, op.shape.split("[")[0]) for op in lowered_ops)
    n_params = case.n_blocks * case.flat_size
    sent = sharded.sent_bytes_per_device(lowered_ops, case.devices)
    formula = costmodel.sharded_data_parallel_bytes_per_step(n_params, 2, case.devices, 1)
    if (written != [("all-gather", "bf16"), ("reduce-scatter", "bf16")]
            or "all-reduce" in compiled_kinds or not np.isclose(sent, formula)):
        raise grading.Refused(
            f"{test}: its program runs {written} (compiled: {sorted(compiled_kinds)}), sending "
            f"{sent:,.0f} B per device; ZeRO-1 reduce-scatters the bf16 gradient and "
            f"all-gathers the bf16 parameters: 2 (p - 1)/p x {2 * n_params:,} B = "
            f"{formula:,.0f} B. Hint: jax.lax.psum_scatter the bf16 gradient (a psum sends "
            "it all), and round the new master to bf16 before jax.lax.all_gather.")


# the library's sharded step: its per-device ZeRO gradient and update (not _gathered_loss:
# the library differentiates it with jax.value_and_grad, so JAX calls it, and a refusal would
# stop the lab's own ZeRO-3 cells)
_SHARDED_STEP = [f"clusterlab.device.parallel.sharded.{name}"
                 for name in ("_zero_local_gradients", "_zero_local_step")]

KEY = {
    "lab06.1": grading.close(_stage3_bytes_on_16, name="bytes per device", rtol=1e-6,
                             hint="Which of parameters, gradients and Adam's moments does stage 3 "
                                  "shard, and over how many devices? The measured shards add "
                                  "Adam's counter."),
    "lab06.2": grading.close(
        costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 3)
        - costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 0),
        name="extra bytes",
        hint="Which collective does stage 3 add to plain data parallelism's, over which bytes, "
             "and what share of them does a ring of p GPUs send from each?"),
    "lab06.3": grading.equal(_all_gathers, name="all-gathers",
                             hint="Stage 3 gathers each block's parameters when it needs them: "
                                  "how often per step? The 3-block count above shows it."),
    "lab06.4": grading.code(
        _check_fsdp_step, name="FSDP step",
        hint="Gather each block's slices just before it runs (jax.lax.all_gather, tiled), "
             "differentiate this device's loss with respect to its slices, divide by p, and "
             "take one SGD step on the slices.",
        exports=[grading.Export(args=_args(case), n_devices=case.devices, wrap="shard_map",
                                axis=_AXIS) for case in _CASES],
        references=_SHARDED_STEP),
    "lab06.5": grading.code(
        _check_zero1_step, name="ZeRO-1 mixed-precision step",
        hint="Differentiate the bf16 loss, jax.lax.psum_scatter the bf16 gradient over the "
             "columns (scatter_dimension=1, tiled), divide by p, cast the slice to float32 "
             "for adam_update, and all-gather the new master rounded to bf16.",
        exports=[grading.Export(args=case.args(), n_devices=case.devices, wrap="shard_map",
                                axis=_AXIS) for case in _MIXED_CASES],
        references=_SHARDED_STEP),
}
