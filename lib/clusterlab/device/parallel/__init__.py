"""Parallel training steps, each beside the single-device reference it must match.

One shape for every strategy: ``make_<strategy>(model, mesh, optimizer=None, *, <axis names>,
automatic=False, ...)`` returns a :class:`Strategy` (``shard``, ``unshard``, ``init_opt_state``,
``place_batch``, ``step``, ``grads``, ``loss_value``, ``mesh``, ``axis_names``), and one
:func:`train` runs any of them and returns host parameters.

* :mod:`clusterlab.device.parallel.data` - data parallelism (pmap, shard_map, or ``automatic``).
* :mod:`clusterlab.device.parallel.tensor` - Megatron-style tensor parallelism (MLP and attention).
* :mod:`clusterlab.device.parallel.pipeline` - pipeline parallelism, GPipe and 1F1B schedules (the
  schedules themselves are :mod:`clusterlab.analytic.schedule`, pure NumPy).
* :mod:`clusterlab.device.parallel.sharded` - sharded data parallelism (ZeRO stages 0-3, FSDP).
* :mod:`clusterlab.device.parallel.two_d` - 2-D data x tensor parallelism.
* :mod:`clusterlab.device.parallel.context` - context parallelism: ring attention (contiguous and
  zig-zag placements) and Ulysses, beside one device's attention; attention layers, not a
  training step, so they have no ``make_<strategy>`` of the shape above.
* :mod:`clusterlab.device.parallel.experts` - a mixture-of-experts layer, expert-parallel
  (all-to-alls).

Communication comes from :mod:`clusterlab.device.collectives`; axis names are arguments.
"""

from clusterlab.device.parallel._common import Params, Strategy, train

# The strategies' shared types and their one training loop; each strategy, and the attention and
# expert layers, are imported from their own module (``from clusterlab.device.parallel import
# data``).
__all__ = ["Params", "Strategy", "train"]
