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
* :mod:`clusterlab.check`, :mod:`clusterlab.plotting` - exercises and figures.
"""

__version__ = "0.1.0"
