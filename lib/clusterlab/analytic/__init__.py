"""The analytical models: NumPy, SciPy and networkx, never JAX.

* :mod:`~clusterlab.analytic.costmodel` - alpha-beta per algorithm, the strategies' traffic, NCCL's
  model across nodes and its validation.
* :mod:`~clusterlab.analytic.plan` - the planner: a step's prediction, the search, fabrics, power.
* :mod:`~clusterlab.analytic.topology`, :mod:`~clusterlab.analytic.fabric` - networks as graphs;
  max-min fair flows over them.
* :mod:`~clusterlab.analytic.memory`, :mod:`~clusterlab.analytic.flops`,
  :mod:`~clusterlab.analytic.gemm` - memory per device, training FLOPs, a matmul's time.
* :mod:`~clusterlab.analytic.moe`, :mod:`~clusterlab.analytic.schedule` - experts' counts, pipeline
  schedules (the NumPy halves of the device code that runs them).
* :mod:`~clusterlab.analytic.storage`, :mod:`~clusterlab.analytic.reliability`,
  :mod:`~clusterlab.analytic.serving` - the data path, failures, serving on the roofline.
* :mod:`~clusterlab.analytic.tables` - sizes as text and tables for the book.

The base install (``pip install clusterlab``) is enough for everything here.
"""
