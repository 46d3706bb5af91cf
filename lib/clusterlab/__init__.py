"""clusterlab: the helper library of the course "GPU Clusters, Hands-On".

Import modules explicitly; importing runs no JAX operation, so devices can still be configured
afterwards. The modules form four layers; a module imports only modules of its own layer or of
an earlier one (``tests/test_layering.py`` enforces it, and that the first two import no JAX):

1. Catalog

   * :mod:`clusterlab.hardware` - GPUs, links, servers, fabrics and the one cluster spec, each
     number with its source.
   * :mod:`clusterlab.published` - measurements the models are held to, each row with its source.

2. Analytical models (NumPy, no JAX)

   * :mod:`clusterlab.costmodel` - alpha-beta per algorithm, the strategies' traffic and the
     pipeline bubble, NCCL's model across nodes and its validation.
   * :mod:`clusterlab.topology`, :mod:`clusterlab.fabric` - cluster networks as graphs; max-min
     fair flows over them (contention, routing, placement).
   * :mod:`clusterlab.memory`, :mod:`clusterlab.flops` - memory per device, training FLOPs, MFU.
   * :mod:`clusterlab.gemm` - a matmul's time on a GPU (tiles in waves over the SMs, a roofline
     against HBM, a benchmark's ceiling) and a transformer layer's GEMMs: the planner's compute.
   * :mod:`clusterlab.storage`, :mod:`clusterlab.reliability` - the data path, failures,
     checkpoint intervals.
   * :mod:`clusterlab.schedule` - pipeline schedules (who runs what in each slot).
   * :mod:`clusterlab.serving` - prefill and decode on the roofline, the KV cache, batching.
   * :mod:`clusterlab.plan` - the planner: a step's prediction, the search, fabrics, power.
   * :mod:`clusterlab.tables` - Markdown tables for the book, sizes as text.

3. Device code (JAX)

   * :mod:`clusterlab.devices` - real or simulated devices, meshes.
   * :mod:`clusterlab.bench` - timing harness, collective sweeps, the host's ceilings.
   * :mod:`clusterlab.collectives` - built-in and hand-built collectives;
     :mod:`clusterlab.hlo` - the collectives a compiled program holds.
   * :mod:`clusterlab.models`, :mod:`clusterlab.parallel` - small models; data, sharded, tensor,
     pipeline and 2-D parallel training, each equal to one device.
   * :mod:`clusterlab.decode` - prefill, decode and the KV cache of a small transformer.
   * :mod:`clusterlab.dataloader`, :mod:`clusterlab.checkpoint` - on-disk shards, a prefetching
     loader; checkpoints that survive a kill (:mod:`clusterlab.train_demo` is the job that is
     killed, :mod:`clusterlab.killtest` the harness that kills it).
   * :mod:`clusterlab.distributed`, :mod:`clusterlab.launch` - joining a process to a job;
     starting a job's processes on this machine.

4. Course machinery

   * :mod:`clusterlab.check` - what a lab calls: exercise answers (:mod:`clusterlab.answers`)
     and its own verifications (:mod:`clusterlab.verification`).
   * :mod:`clusterlab.grading`, :mod:`clusterlab.student` - keys and grading; student copies.
   * :mod:`clusterlab.plotting` - one look for every figure (importable without JAX).
   * :mod:`clusterlab.expect` and ``python -m clusterlab`` - judging nccl-tests results; the
     command line. :mod:`clusterlab.examples` - programs run in several processes.
"""

__version__ = "0.1.0"
