"""Parallel training steps, each beside the single-device reference it must match.

One shape for every strategy: ``make_<strategy>(model, mesh, optimizer=None, *, <axis names>,
automatic=False, ...)`` returns a :class:`Strategy` (``shard``, ``unshard``, ``init_opt_state``,
``place_batch``, ``step``, ``grads``, ``loss_value``, ``mesh``, ``axis_names``), and one
:func:`train` runs any of them and returns host parameters.

* :mod:`clusterlab.parallel.data` - data parallelism (pmap, shard_map, or ``automatic``).
* :mod:`clusterlab.parallel.tensor` - Megatron-style tensor parallelism (MLP and attention).
* :mod:`clusterlab.parallel.pipeline` - pipeline parallelism, GPipe and 1F1B schedules (the
  schedules themselves are :mod:`clusterlab.schedule`, pure NumPy).
* :mod:`clusterlab.parallel.sharded` - sharded data parallelism (ZeRO stages 0-3, FSDP).
* :mod:`clusterlab.parallel.two_d` - 2-D data x tensor parallelism.
* :mod:`clusterlab.parallel.context` - context parallelism: ring attention (contiguous and
  zig-zag placements) and Ulysses, beside one device's attention; attention layers, not a
  training step, so they have no ``make_<strategy>`` of the shape above.
* :mod:`clusterlab.parallel.experts` - a mixture-of-experts layer, expert-parallel (all-to-alls).

Communication comes from :mod:`clusterlab.collectives`; axis names are arguments.
"""

from clusterlab.parallel._common import Params, Strategy, train

from clusterlab.parallel.context import (  # noqa: E402
    make_ring_attention, make_ulysses_attention, reference_attention, ring_attention,
    ulysses_attention)

__all__ = ["Params", "Strategy", "train"]
__all__ += ["make_ring_attention", "make_ulysses_attention", "reference_attention",
            "ring_attention", "ulysses_attention"]

from clusterlab.parallel import experts  # noqa: E402
from clusterlab.parallel.experts import moe_dense, moe_expert_parallel  # noqa: E402

__all__ += ["experts", "moe_dense", "moe_expert_parallel"]
