"""What every parallel strategy shares: the :class:`Strategy` bundle, :func:`train`, and helpers.

Every strategy module has one constructor of the same shape,

    ``make_<strategy>(model, mesh, optimizer=None, *, <axis names>, automatic=False, ...)``

where ``model`` is what the strategy needs to know of the model (the loss function for data
parallelism, which splits only the batch; the unsharded parameters, to read their structure, for
the strategies that split them), and each returns a :class:`Strategy`. :func:`train` runs any of
them like :func:`clusterlab.device.models.reference_train` and returns host parameters.

The helpers below (optimizer-state layouts, one divisibility check, the gradient reduction's
name) exist once here so that the strategies cannot drift apart; ``automatic=True`` hands the
compiler :func:`clusterlab.device.models.make_train_step`, the single-device step of
:func:`clusterlab.device.models.reference_train` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, TypeAlias, get_args

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clusterlab.device import models
from clusterlab.device.devices import axis_size

Params = models.Params   # one pytree alias for the library (clusterlab.device.models)
AxisNames: TypeAlias = str | tuple[str, ...]
Reduction = Literal["mean", "sum"]
REDUCTIONS = get_args(Reduction)
LossFn = Callable[..., jax.Array]
# step(params, opt_state, x, y) -> (params, opt_state, loss)
Step = Callable[..., tuple[Params, Any, jax.Array]]


@dataclass(frozen=True)
class Strategy:
    """A parallel training step and the functions that lay out its inputs and read its outputs.

    Attributes:
        name: the strategy, e.g. ``"data/shard_map"``, ``"zero3"``, ``"tensor"``.
        mesh: the device mesh it runs on.
        axis_names: the mesh axes it uses, in the order its constructor took them.
        automatic: True when the collectives are left to the compiler (``jax.jit`` of the
            single-device step with shardings), False when written out (``shard_map``, ``pmap``).
        shard: ``shard(params) -> laid_out``: host parameters (as the model's ``init`` makes
            them) to the layout ``step`` takes.
        unshard: ``unshard(laid_out) -> params``: the inverse, NumPy arrays on the host,
            structured as the model's ``init`` makes them.
        init_opt_state: ``init_opt_state(laid_out) -> opt_state``, laid out for ``step``.
        place_batch: ``place_batch(x, y) -> (x, y)``: a global batch placed as ``step`` takes
            it (split over the data axes, or replicated); raises a ValueError naming the fix
            when it does not split.
        step: ``step(laid_out, opt_state, x, y) -> (laid_out, opt_state, loss)``, compiled (its
            ``.lower`` works, so :func:`clusterlab.device.hlo.compiled_collectives` reads it).
        grads: ``grads(laid_out, x, y) -> grads`` on the host: the gradient the step's
            optimizer receives, computed by the same code, to check against
            :func:`clusterlab.device.models.reference_gradients` (Adam hides a uniform wrong factor,
            the gradients do not). Structured as ``unshard``'s parameters, except for data
            parallelism, where every device holds a whole copy: one row per device (leaves
            f32[p, ...]), so that a check sees every replica.
        loss_value: ``loss_value(loss) -> f32[]``: the step's loss output as one number.
    """

    name: str
    mesh: Mesh
    axis_names: tuple[str, ...]
    automatic: bool
    shard: Callable[[Params], Params]
    unshard: Callable[[Params], Params]
    init_opt_state: Callable[[Params], Any]
    place_batch: Callable[..., tuple[jax.Array, jax.Array]]
    step: Step
    grads: Callable[..., Params]
    loss_value: Callable[[Any], np.ndarray]

    @property
    def n_devices(self) -> int:
        """The devices along ``axis_names`` together (p for data parallelism over them)."""
        return axes_size(self.mesh, self.axis_names)

    def init(self, params: Params) -> tuple[Params, Any]:
        """``(shard(params), init_opt_state(shard(params)))``: both inputs of ``step``."""
        laid_out = self.shard(params)
        return laid_out, self.init_opt_state(laid_out)


def train(strategy: Strategy, params: Params,
          batches: Iterable[tuple[jax.typing.ArrayLike, jax.typing.ArrayLike]]
          ) -> tuple[Params, np.ndarray]:
    """Train with any strategy: the counterpart of :func:`clusterlab.device.models.reference_train`.

    Args:
        strategy: from one of the ``make_*`` constructors.
        params: initial parameters on the host, as the model's ``init`` makes them.
        batches: ``(x, y)`` global batches, one per step, each placed by ``place_batch``.

    Returns:
        ``(params, losses)``: the trained parameters on the host (``strategy.unshard``), and
        the global batch's loss before each update, a NumPy f32[n_steps].

    Raises:
        ValueError: when ``batches`` is empty, or a batch does not split as the strategy needs.
    """
    laid_out, opt_state = strategy.init(params)
    laid_out, _, losses = models.run_steps(strategy.step, laid_out, opt_state, batches,
                                           place=strategy.place_batch,
                                           loss_value=strategy.loss_value)
    return strategy.unshard(laid_out), losses


def as_axis_names(axis_name: AxisNames) -> tuple[str, ...]:
    """One axis name or several, as a tuple (``"data"`` -> ``("data",)``)."""
    return (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)


def axes_size(mesh: Mesh, axis_names: AxisNames) -> int:
    """Devices along all of ``axis_names`` together, after checking each is a mesh axis."""
    return math.prod(axis_size(mesh, name) for name in as_axis_names(axis_names))


def spec_axes(axis_names: tuple[str, ...]) -> str | tuple[str, ...]:
    """The entry of a PartitionSpec that splits one dimension over ``axis_names``."""
    return axis_names[0] if len(axis_names) == 1 else axis_names


def check_divisible(size: int, parts: int, message: str) -> None:
    """Raise a ValueError unless ``size`` splits into ``parts`` equal whole pieces.

    Args:
        size: what is split (examples, blocks, hidden units, heads, parameters).
        parts: into how many pieces (devices, stages, micro-batches).
        message: the error, a ``str.format`` template that may use ``{size}``, ``{parts}``,
            ``{multiple}`` (the next multiple of ``parts`` above ``size``) and ``{divisor}``
            (the largest count up to ``parts`` that divides ``size``).
    """
    if size % parts:
        divisor = max(d for d in range(1, parts + 1) if size % d == 0)
        raise ValueError(message.format(size=size, parts=parts, divisor=divisor,
                                         multiple=(size // parts + 1) * parts))


BATCH_MESSAGE = (
    "The global batch of {size} examples does not split evenly over {parts} data-parallel "
    "devices: each device needs batch/devices whole examples. Use a batch that is a multiple of "
    "{parts} (e.g. {multiple}), or a device count that divides {size} (e.g. {divisor}).")


def check_batch(batch_size: int, n_devices: int) -> None:
    """Raise a ValueError unless a global batch splits evenly over the data-parallel devices.

    Args:
        batch_size: B, examples in the global batch.
        n_devices: p, devices along the data-parallel axes.
    """
    check_divisible(batch_size, n_devices, BATCH_MESSAGE)


def varying(x: jax.Array, axis_name: str) -> jax.Array:
    """``x`` typed as varying over ``axis_name`` inside ``shard_map`` (a scan's carry and both
    branches of a ``lax.cond`` must keep one type); unchanged when it already is."""
    if axis_name in jax.typeof(x).manual_axis_type.varying:
        return x
    return jax.lax.pcast(x, axis_name, to="varying")


def check_reduce(reduce: str) -> None:
    """Raise a ValueError unless ``reduce`` names a gradient reduction, "mean" or "sum"."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be 'mean' (the gradient of the global batch's mean loss, "
                         f"for a loss_fn that is a mean over its batch) or 'sum' (for a loss_fn "
                         f"already divided by the global batch size); got {reduce!r}.")


def optimizer_or_adam(optimizer: optax.GradientTransformation | None
                      ) -> optax.GradientTransformation:
    """``optimizer``, or :func:`clusterlab.device.models.make_optimizer`'s Adam when it is None."""
    return models.make_optimizer() if optimizer is None else optimizer


def update(optimizer: optax.GradientTransformation, params: Params, opt_state: Any,
           grads: Params) -> tuple[Params, Any]:
    """One optimizer update: ``(params, opt_state)`` after applying ``grads``."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def named(mesh: Mesh, specs: Any) -> Any:
    """A tree of PartitionSpecs as the NamedShardings of ``mesh`` (for ``jax.jit``)."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                        is_leaf=lambda v: isinstance(v, P))


def opt_state_specs(optimizer: optax.GradientTransformation, params: Params,
                    specs: Params) -> Any:
    """The PartitionSpec of every leaf of ``optimizer``'s state, from its parameters' specs.

    Args:
        optimizer: an element-wise ``optax`` optimizer (Adam's moments are shaped like the
            parameters, its step count is a scalar).
        params: the unsharded parameters (for shapes only).
        specs: a PartitionSpec per leaf of ``params``: how its state is split.

    Returns:
        The state's specs: each per-parameter leaf takes its parameter's spec, the rest ``P()``.
    """
    state_shapes = jax.eval_shape(optimizer.init, params)
    return optax.tree_map_params(optimizer, lambda _, spec: spec, state_shapes, specs,
                                 transform_non_params=lambda _: P(),
                                 is_leaf=lambda v: isinstance(v, P))


def opt_state_initializer(optimizer: optax.GradientTransformation, mesh: Mesh,
                          state_specs: Any) -> Callable[[Params], Any]:
    """``init_opt_state(laid_out) -> opt_state``, each leaf placed as ``state_specs`` says."""
    return jax.jit(optimizer.init, out_shardings=named(mesh, state_specs))


def automatic_programs(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                       params: Any, batch: P, opt_state: Any = None,
                       compiler_options: dict | None = None) -> tuple[Step, Callable]:
    """A strategy left to the compiler: the single-device step and its gradient under ``jax.jit``.

    Every strategy's ``automatic=True`` form is this function with its own layout: XLA's SPMD
    partitioner reads the shardings and inserts the communication (count it in the compiled
    program). The loss comes out replicated.

    Args:
        loss_fn: ``loss_fn(params, x, y) -> f32[]`` on one device.
        optimizer: the ``optax`` optimizer of the step.
        mesh: the mesh.
        params: a PartitionSpec, or a tree of them, for the parameters (and their gradients).
        batch: the PartitionSpec of ``x`` and ``y``.
        opt_state: the optimizer state's spec or specs; ``None`` lets the compiler choose.
        compiler_options: XLA options for both programs.

    Returns:
        ``(step, grads)``: ``step(params, opt_state, x, y) -> (params, opt_state, loss)`` and
        ``grads(params, x, y)``, laid out as the parameters.
    """
    params_in, batch_in = named(mesh, params), NamedSharding(mesh, batch)
    state = None if opt_state is None else named(mesh, opt_state)
    step = jax.jit(models.make_train_step(loss_fn, optimizer),
                   in_shardings=(params_in, state, batch_in, batch_in),
                   out_shardings=(params_in, state, NamedSharding(mesh, P())),
                   compiler_options=compiler_options)
    grads = jax.jit(jax.grad(loss_fn), in_shardings=(params_in, batch_in, batch_in),
                    out_shardings=params_in, compiler_options=compiler_options)
    return step, grads


def to_host(tree: Params) -> Params:
    """Every leaf of ``tree`` as a NumPy array on the host."""
    return jax.tree.map(np.asarray, jax.device_get(tree))
