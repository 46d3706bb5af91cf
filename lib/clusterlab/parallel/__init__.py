"""Parallel training steps, each beside the single-device reference it must match.

* :mod:`clusterlab.parallel.data` - data parallelism three ways (pmap, shard_map, jit).
* :mod:`clusterlab.parallel.tensor` - Megatron-style tensor parallelism (MLP and attention).
* :mod:`clusterlab.parallel.pipeline` - pipeline parallelism, GPipe and 1F1B schedules.
* :mod:`clusterlab.parallel.sharded` - sharded data parallelism (ZeRO/FSDP) and 2-D meshes.

Communication comes from :mod:`clusterlab.collectives`; axis names are arguments.
"""
