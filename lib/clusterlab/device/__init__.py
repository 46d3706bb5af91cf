"""Device code: programs that run on JAX devices, real GPUs or simulated CPU devices.

* :mod:`~clusterlab.device.devices` - real or simulated devices, meshes.
* :mod:`~clusterlab.device.bench`, :mod:`~clusterlab.device.profile` - timing and profiles.
* :mod:`~clusterlab.device.collectives`, :mod:`~clusterlab.device.hlo` - built-in and hand-built
  collectives; the collectives a compiled program holds.
* :mod:`~clusterlab.device.models`, :mod:`~clusterlab.device.parallel`,
  :mod:`~clusterlab.device.decode` - small models; parallel training, each strategy equal to one
  device; prefill and decode with a KV cache.
* :mod:`~clusterlab.device.dataloader`, :mod:`~clusterlab.device.checkpoint`,
  :mod:`~clusterlab.device.train_demo`, :mod:`~clusterlab.device.killtest` - the data path and
  checkpoints that survive a kill.
* :mod:`~clusterlab.device.distributed`, :mod:`~clusterlab.device.launch` - joining and starting
  a multi-process job.

Needs the ``device`` extra (``pip install clusterlab[device]``: jax, optax, orbax, grain).
"""
