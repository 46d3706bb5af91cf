"""clusterlab: the helper library of the course "GPU Clusters, Hands-On".

Four packages, one per layer; a package imports only its own layer and those above it in this
list (``tests/test_layering.py`` holds the rule on paths):

* :mod:`clusterlab.catalog` - hardware and published measurements, each with its source.
* :mod:`clusterlab.analytic` - the models: NCCL's cost model, the planner, fabrics, memory,
  FLOPs, serving. NumPy, SciPy and networkx; never JAX. The base install runs it.
* :mod:`clusterlab.device` - code that runs on JAX devices: collectives, parallel strategies,
  benchmarks, checkpoints, multi-process jobs (the ``device`` extra).
* :mod:`clusterlab.course` - checks, grading, student copies, figures, ``expect`` and the
  command line (the ``course`` extra for grading).

Import modules explicitly (``from clusterlab.analytic import plan``). Importing runs no JAX
operation, so devices can still be configured afterwards.
"""

__version__ = "0.1.0"
