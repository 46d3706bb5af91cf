"""clusterlab: the helper library of the course "GPU Clusters, Hands-On".

Modules (import them explicitly; importing runs no JAX operation, so devices can still be
configured afterwards):

* :mod:`clusterlab.devices` - real or simulated devices, meshes.
* :mod:`clusterlab.bench` - timing harness, collective sweeps, the host's ceilings.
* :mod:`clusterlab.collectives` - built-in and hand-built collectives.
* :mod:`clusterlab.costmodel` - the alpha-beta model, busbw factors, fitting.
* :mod:`clusterlab.hardware` - GPUs, links, servers and fabrics with their sources.
* :mod:`clusterlab.topology` - cluster networks as graphs; bisection bandwidth by min-cut.
* :mod:`clusterlab.flops`, :mod:`clusterlab.memory` - training FLOPs, MFU, memory per device.
* :mod:`clusterlab.storage`, :mod:`clusterlab.reliability` - the data path, failures, checkpoints.
* :mod:`clusterlab.models`, :mod:`clusterlab.parallel` - small models; data, tensor, pipeline
  and sharded data parallel training steps, each equal to one device.
* :mod:`clusterlab.dataloader`, :mod:`clusterlab.checkpoint` - on-disk shards, a prefetching loader;
  checkpoints that survive a kill (:mod:`clusterlab.train_demo` is the job that is killed,
  :mod:`clusterlab.killtest` the harness that kills it).
* :mod:`clusterlab.distributed`, :mod:`clusterlab.launch` - several JAX processes, one job.
* :mod:`clusterlab.serving` - serving: prefill and decode on the roofline, the KV cache,
  batching, tensor parallelism for latency, disaggregation, sizing a serving cluster.
* :mod:`clusterlab.plan` - the planner; :mod:`clusterlab.student` - student copies of the labs.
* :mod:`clusterlab.check`, :mod:`clusterlab.plotting` - exercises and figures.
"""

__version__ = "0.1.0"
