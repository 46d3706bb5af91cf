"""The catalog: hardware and published measurements, each number with its source.

* :mod:`clusterlab.catalog.hardware` - GPUs, links, servers, fabrics and the one cluster spec.
* :mod:`clusterlab.catalog.published` - measurements the models are held to, row by row.

Imports nothing of the library above it, and no JAX.
"""
