"""clusterlab: the helper library of the course "GPU Clusters, Hands-On".

Modules (import them explicitly; importing runs no JAX operation, so devices can still be
configured afterwards):

* :mod:`clusterlab.devices` - real or simulated devices, meshes.
* :mod:`clusterlab.bench` - timing harness, collective sweeps, the host's ceilings.
* :mod:`clusterlab.collectives` - built-in and hand-built collectives.
* :mod:`clusterlab.costmodel` - the alpha-beta model, busbw factors, fitting.
* :mod:`clusterlab.hardware` - GPUs and links with their sources.
* :mod:`clusterlab.check`, :mod:`clusterlab.plotting` - exercises and figures.
"""

__version__ = "0.1.0"
