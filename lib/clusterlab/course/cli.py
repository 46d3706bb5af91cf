"""Command line: ``python -m clusterlab bench OP --devices N --min 4K --max 64M``,
``python -m clusterlab plan --params 70e9 --tokens 2e12 --gpu H100 --gpus 1024``,
``python -m clusterlab expect all_reduce --gpu H100 --nodes 4 --measured all_reduce.log``
and ``python -m clusterlab grade SUBMISSION.ipynb --key keys``.

``bench`` prints an nccl-tests-style table for one collective on the devices JAX sees, or on
simulated CPU devices when there are not enough. ``plan`` prints the planner's ranking of
parallel layouts for a workload on a cluster (:mod:`clusterlab.analytic.plan`); it runs no JAX.
``expect`` prints the bus bandwidth :func:`clusterlab.analytic.costmodel.cluster_collective` expects
per message size, with a band set by the model's measured error in that regime, and with
``--measured`` holds an nccl-tests output (text or ``-J`` JSON) against it
(:mod:`clusterlab.course.expect`); it runs no JAX. ``grade`` runs submitted lab notebooks and grades
every exercise from the instructor's key (:mod:`clusterlab.course.grading`).
"""

from __future__ import annotations

import argparse
import os
import sys

# Only the analytical layer at the top: `plan`, `expect` and `--help` start without JAX. `bench`
# imports the device layer and `grade` the grader when they run.
from clusterlab.analytic import costmodel, plan, tables
from clusterlab.analytic.plan.workload import RECOMPUTE_POLICIES
from clusterlab.catalog import hardware
from clusterlab.course import expect as expect_module


def _size(text: str) -> int:
    try:
        return tables.parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clusterlab",
                                     description="Tools of the course GPU Clusters, Hands-On.")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="time a collective over message sizes (nccl-tests style)",
        description="Time a collective over message sizes and print size, count, type, time, "
                    "algbw and busbw as nccl-tests does. Sizes use powers of 1024 (4K = 4096 B).")
    bench.add_argument("op", choices=costmodel.RUNNABLE_OPS)
    bench.add_argument("--devices", type=int, default=8, help="devices to use (default 8)")
    bench.add_argument("--min", dest="smallest", type=_size, default=_size("4K"),
                       help="smallest message, e.g. 4K (default)")
    bench.add_argument("--max", dest="largest", type=_size, default=_size("16M"),
                       help="largest message, e.g. 64M (default 16M)")
    bench.add_argument("--factor", type=int, default=2, help="size step factor (default 2)")
    bench.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "int32"))
    bench.add_argument("--implementation", default="builtin",
                       choices=costmodel.IMPLEMENTATIONS)
    bench.add_argument("--warmup", type=int, default=2)
    bench.add_argument("--repeats", type=int, default=5)
    _plan_parser(commands)
    _expect_parser(commands)
    _grade_parser(commands)
    return parser


def _grade_parser(commands) -> None:
    grade = commands.add_parser(
        "grade", help="run submitted lab notebooks and grade every exercise from the key",
        description="Run each submitted notebook in its own kernel (a failing cell does not stop "
                    "it), then judge every exercise of its lab from the instructor's key "
                    "(keys/labNN.py): one line per exercise (✓, or ✗ with the hint) and a "
                    "total. An exercise whose check call was deleted scores zero. Exits 1 when "
                    "any exercise fails, 2 when a submission cannot be graded.")
    grade.add_argument("submissions", nargs="+", metavar="SUBMISSION.ipynb",
                       help="notebooks named like the lab they answer (NN-*.ipynb)")
    grade.add_argument("--key", default="keys", help="folder of the keys labNN.py (keys)")
    grade.add_argument("--timeout", type=float, default=600,
                       help="longest run of one cell, seconds (600)")


def _expect_parser(commands) -> None:
    expect = commands.add_parser(
        "expect", help="expected nccl-tests busbw for a cluster; judge a measured log",
        description="Print the bus bandwidth (nccl-tests' busbw, GB/s) that "
                    "clusterlab.analytic.costmodel.cluster_collective (NCCL's own tuning model) "
                    "expects per message size, with the band's floor and the algorithm NCCL "
                    "would pick. "
                    "The floor is the model's measured error in that regime (nodes, fabric, "
                    "op, size class) over published nccl-tests rows; where a regime has too "
                    "few rows the expectation is unvalidated, and it is validated only where "
                    "the regime's median error is within 15% on the rows' node counts; every "
                    "verdict says which. With "
                    "--measured, read an nccl-tests *_perf output (text, or its -J JSON file) "
                    "and give a verdict per size: normal, low (with likely causes) or high "
                    "(above line rate: in-network reduction).")
    expect.add_argument("op", choices=expect_module.OPS)
    expect.add_argument("--gpu", required=True,
                        help="GPU name in clusterlab.catalog.hardware, e.g. H100")
    expect.add_argument("--nodes", type=int, required=True, help="nodes")
    expect.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (8)")
    expect.add_argument("--nvlink-domain", type=int, default=None, metavar="GPUS",
                        help="GPUs per NVLink domain where it spans hosts (72: an NVL72 rack "
                             "of 4-GPU hosts; NCCL's MNNVL); default: the node's GPUs")
    expect.add_argument("--nic", default=None,
                        help="NIC link in clusterlab.catalog.hardware.LINKS "
                             f"({expect_module.DEFAULT_NIC} when --nodes > 1)")
    expect.add_argument("--nics-per-node", type=int, default=None,
                        help="NICs per node NCCL uses (one per GPU)")
    expect.add_argument("--fabric", choices=costmodel.FABRICS, default=None,
                        help="the network's kind, for the regime whose error sets the band "
                             "(default: InfiniBand for IB-* NICs, else Ethernet; NVLink on one "
                             "node, PCIe with a PCIe --node-link)")
    expect.add_argument("--node-link", default=None,
                        help="link between the GPUs of a node in clusterlab.catalog.hardware.LINKS "
                             "(default: the GPU's NVLink), e.g. PCIe4x16")
    expect.add_argument("--algorithm", default="auto",
                        choices=("auto", *costmodel.CLUSTER_ALGORITHMS),
                        help="the algorithm the run forced (NCCL_ALGO), or auto: NCCL's choice "
                             "(collnet_direct and collnet_chain need --sharp)")
    expect.add_argument("--sharp", action="store_true",
                        help="the InfiniBand switches reduce (SHARP, with NCCL_COLLNET_ENABLE=1):"
                             " NCCL may then run CollNet direct or chain, and NVLS across nodes")
    expect.add_argument("--transport", choices=tuple(expect_module.TRANSPORTS), default="ib",
                        help="NCCL's network transport: ib (default: InfiniBand or RoCE "
                             "verbs, which NCCL's model prices), efa (AWS aws-ofi-nccl) or "
                             "socket (plain Ethernet), judged only where published rows of "
                             "them exist, or tcpxo (GCP; refused: unpriced)")
    expect.add_argument("--sizes", default="1M,8M,64M,512M,4G",
                        help="increasing sizes, powers of 1024 (1M,8M,64M,512M,4G)")
    expect.add_argument("--measured", help="an nccl-tests *_perf output to judge: its text "
                                           "output, or its -J JSON file ('-': standard input)")
    expect.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _sizes(text: str) -> list[int]:
    sizes = [tables.parse_size(part) for part in text.split(",") if part.strip()]
    for before, after in zip(sizes, sizes[1:]):
        if after <= before:
            raise ValueError(f"--sizes must increase: {after} B comes after {before} B; write "
                             "them smallest first, e.g. --sizes 1M,16M,256M.")
    if not sizes:
        raise ValueError("--sizes is empty; give sizes such as --sizes 1M,16M,256M.")
    return sizes


def _fabric_options(args: argparse.Namespace, cluster: hardware.ClusterSpec) -> None:
    """Refuse network options the configuration cannot have (--fabric, --transport, --sharp, a
    CollNet --algorithm), naming the fix. Hosts of one NVLink domain (--nvlink-domain) cross
    NVLink only, as one node does."""
    domains = cluster.n_nvlink_domains
    if args.algorithm.startswith("collnet") and not args.sharp:
        raise ValueError(f"--algorithm {args.algorithm} reduces in the InfiniBand switches "
                         "(NCCL CollNet over SHARP): give --sharp too (a run with "
                         "NCCL_COLLNET_ENABLE=1 and the SHARP plugin), or another --algorithm.")
    infiniband = (args.nic or "IB-").startswith("IB-") and args.fabric in (None, "InfiniBand")
    if args.sharp and (domains == 1 or not infiniband or args.transport != "ib"):
        raise ValueError("--sharp reduces in InfiniBand switches between nodes (NCCL reaches "
                         "SHARP through nccl-rdma-sharp-plugins): give --nodes > 1 with an IB-* "
                         "--nic and --transport ib, or drop --sharp (inside one node NVLS, "
                         "NVLink SHARP, is NCCL's default without it).")
    if args.transport == "efa" and args.fabric not in (None, "EFA"):
        raise ValueError(f"--transport efa crosses AWS EFA, not {args.fabric}: give --fabric "
                         "EFA or drop --fabric.")
    if args.fabric == "EFA" and args.transport != "efa":
        raise ValueError("--fabric EFA is reached through the aws-ofi-nccl plugin, not NCCL's "
                         "NET/IB: give --transport efa.")
    if args.fabric == "Ethernet" and args.transport != "socket":
        raise ValueError("--fabric Ethernet (no RDMA) runs NCCL over TCP sockets, not NET/IB: "
                         "give --transport socket, or --fabric RoCE for RDMA over Ethernet.")
    if args.transport == "socket" and args.fabric not in (None, "Ethernet"):
        raise ValueError(f"--transport socket crosses plain Ethernet, not {args.fabric}: give "
                         "--fabric Ethernet or drop --fabric.")
    if args.fabric is None:
        return
    one_node = args.fabric in ("NVLink", "PCIe")
    if domains == 1 and not one_node:
        raise ValueError(f"--fabric {args.fabric} is a network between nodes; one node crosses "
                         "NVLink or PCIe, and so do the hosts of one NVLink domain (give "
                         "--fabric NVLink, or more --nodes).")
    if domains > 1 and one_node:
        raise ValueError(f"--fabric {args.fabric} is a link inside a node; {domains} nodes (or "
                         "NVLink domains) cross InfiniBand, RoCE, EFA or Ethernet.")
    pcie = (args.node_link or "").startswith("PCIe")
    if args.fabric == "PCIe" and not pcie:
        raise ValueError("--fabric PCIe needs the PCIe link the GPUs share: give --node-link "
                         "PCIe4x16 (or PCIe5x16).")
    if args.fabric == "NVLink" and pcie:
        raise ValueError(f"--node-link {args.node_link} is PCIe; give --fabric PCIe.")
    if args.fabric == "InfiniBand" and args.nic and not args.nic.startswith("IB-"):
        raise ValueError(f"--nic {args.nic} is not an InfiniBand port; give an IB-* --nic "
                         "(e.g. IB-NDR) or the --fabric it is (RoCE, EFA, Ethernet).")
    if args.fabric in ("RoCE", "EFA", "Ethernet") and args.nodes > 1 and not (
            args.nic or "").startswith("Ethernet-"):
        raise ValueError(f"--fabric {args.fabric} runs on Ethernet ports: give --nic "
                         "Ethernet-400G (or Ethernet-100G/200G/800G) and --nics-per-node.")


def _expect(args: argparse.Namespace) -> None:
    for flag, value, lookup in (("--gpu", args.gpu, hardware.gpu),
                                ("--nic", args.nic, hardware.link),
                                ("--node-link", args.node_link, hardware.link)):
        if value is not None:
            try:
                lookup(value)
            except ValueError as error:
                raise ValueError(f"{flag} {value}: {error} Use one of these names.") from None
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise ValueError("--nodes and --gpus-per-node must be positive integers.")
    if args.transport in ("efa", "socket") and args.fabric is None:
        # The transport's own published rows set the band of its runs.
        args.fabric = {"efa": "EFA", "socket": "Ethernet"}[args.transport]
    cluster = expect_module.cluster_from_options(args.gpu, args.nodes, args.gpus_per_node,
                                                 nic=args.nic, nics_per_node=args.nics_per_node,
                                                 node_link=args.node_link, sharp=args.sharp,
                                                 nvlink_domain=args.nvlink_domain)
    _fabric_options(args, cluster)
    measurement = None
    if args.measured:
        name = "standard input" if args.measured == "-" else args.measured
        try:
            if args.measured == "-":
                text = sys.stdin.read()
            else:
                with open(args.measured, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
        except OSError as error:
            raise ValueError(f"Cannot read {args.measured}: {error.strerror}; give the path of "
                             "a file holding an nccl-tests output (e.g. all_reduce_perf ... > "
                             "log, or all_reduce_perf -J log.json).") from None
        measurement = expect_module.read_measurement(text, name=name)
        expect_module.check_measurement(measurement, args.op, cluster, name=name)
        sizes = [size for size, _ in measurement.rows]
    else:
        sizes = _sizes(args.sizes)
    expect_module.check_transport(args.transport, args.op, sizes, cluster)
    rows = expect_module.verdicts(args.op, sizes, cluster, fabric=args.fabric,
                                  algorithm=args.algorithm,
                                  measured=None if measurement is None else dict(measurement.rows))
    print(expect_module.report(rows, args.op, cluster, algorithm=args.algorithm,
                               transport=args.transport, measurement=measurement,
                               as_json=args.json))


_SPACE = plan.SearchSpace()  # the search's defaults, which the flags narrow


def _plan_parser(commands) -> None:
    plan = commands.add_parser(
        "plan", help="size a cluster for a training run and rank parallel layouts",
        description="Predict memory per GPU, step time (compute, tensor-parallel and "
                    "data-parallel all-reduce, pipeline bubble, storage), MFU and time to train "
                    "for a dense transformer, or one with experts (--experts), for every layout "
                    "that fits; or, with --budget-days and no --gpus, the smallest cluster that "
                    "meets the budget. Memory counts model states and activations. Each "
                    "layout flag pins its axis with one value or searches a comma list.")
    _plan_model_options(plan)
    _plan_layout_options(plan)
    _plan_run_options(plan)


def _plan_model_options(plan: argparse.ArgumentParser) -> None:
    """The workload and the model's shape."""
    plan.add_argument("--params", type=float,
                      help="model parameters, e.g. 70e9 (default: counted from --layers, "
                           "--d-model, --heads, --kv-heads, --ffn and --vocab)")
    plan.add_argument("--tokens", type=float,
                      help="training tokens, e.g. 2e12 (default: none, only the step)")
    plan.add_argument("--budget-days", type=float, help="wall-clock budget in days")
    plan.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (4096)")
    plan.add_argument("--batch", type=int, default=1024,
                      help="global batch in sequences (1024)")
    plan.add_argument("--layers", type=int, help="transformer layers (default: from --params)")
    plan.add_argument("--d-model", type=int, help="model width (default: from --params)")
    plan.add_argument("--heads", type=int, help="attention heads (default: d-model / 128)")
    plan.add_argument("--kv-heads", type=int,
                      help="key/value heads, grouped-query attention (default: --heads)")
    plan.add_argument("--ffn", type=int,
                      help="hidden width of the gated (SwiGLU) MLP, e.g. 53248; counts "
                           "--params when it is not given")
    plan.add_argument("--vocab", type=int,
                      help="vocabulary: the output layer priced on the last stage (default: "
                           "none)")
    plan.add_argument("--precision", choices=("bf16", "fp8"), default="bf16",
                      help="training precision (bf16); fp8: the linear GEMMs at the FP8 "
                           "peak, attention and the rest in BF16")


def _plan_layout_options(plan: argparse.ArgumentParser) -> None:
    """The layout axes (one value pins, a comma list searches) and the experts."""
    plan.add_argument("--tensor-parallel", type=_positive_ints, default=_SPACE.tp,
                      help="tensor-parallel degrees, e.g. 8 or 2,4,8 (default: every divisor "
                           "of a node)")
    plan.add_argument("--recompute", nargs="?", const="full", type=_policies,
                      help="recomputation policies to search, comma-separated among "
                           f"{','.join(RECOMPUTE_POLICIES)} (default: "
                           f"{','.join(_SPACE.recompute)}; flash_full, full recomputation with "
                           "FlashAttention, on request; --recompute alone: full)")
    plan.add_argument("--micro-batches", type=_positive_ints, default=_SPACE.micro_batches,
                      help="micro-batch sizes to search, e.g. 1,2,4 (1,2,4,8)")
    plan.add_argument("--virtual-stages", type=_positive_ints, default=_SPACE.virtual_stages,
                      help="interleaved virtual stages to search, e.g. 1,2 (1,2,4)")
    plan.add_argument("--context-parallel", type=_positive_ints, default=_SPACE.cp,
                      help="context-parallel degrees to search, e.g. 1,4,16 (1: none)")
    plan.add_argument("--expert-parallel", type=_positive_ints, default=_SPACE.ep,
                      help="expert-parallel degrees to search, carved from dp, e.g. 1,8 (1: "
                           "none; needs --experts); its all-to-alls are unvalidated")
    plan.add_argument("--pipeline-parallel", type=_positive_ints, default=_SPACE.pp,
                      help="pipeline depths to search, e.g. 1,2 (default: every divisor)")
    plan.add_argument("--experts", type=int, help="experts per MoE layer (default: a dense "
                                                  "model), e.g. 8")
    plan.add_argument("--top-k", type=int, help="experts each token runs (with --experts; 2)")
    plan.add_argument("--expert-mlp", type=int,
                      help="hidden width of one gated expert MLP (with --experts), e.g. 14336")
    plan.add_argument("--moe-layers", type=int,
                      help="layers with experts (with --experts; default: every layer)")
    plan.add_argument("--capacity-factor", type=float,
                      help="expert capacity factor of the dispatch buffers (with --experts; 1)")
    plan.add_argument("--clamped-activation", action="store_true",
                      help="the experts' gated activation clamps its inputs in eager kernels, "
                           "as GPT-OSS does (with --experts)")
    plan.add_argument("--expert-bias", action="store_true",
                      help="the experts' output projection has a bias, added expert by expert "
                           "(GPT-OSS; with --experts)")
    plan.add_argument("--recompute-expert-activation", action="store_true",
                      help="the experts' activation is recomputed in the backward pass "
                           "(Megatron Core's recompute_modules moe_act; with --experts)")
    plan.add_argument("--load-imbalance", type=float,
                      help="the busiest expert's tokens over the mean, >= 1 (with --experts; "
                           "1: balanced, as published benchmarks force it); the GPU holding "
                           "that expert sets the layer's pace")
    plan.add_argument("--zero", type=_zero_stages, default=_SPACE.zero_stages,
                      help="ZeRO stages to search, e.g. 1,3 (0,1,2,3; 0 alone when dp = 1)")


def _plan_run_options(plan: argparse.ArgumentParser) -> None:
    """The cluster, the storage, the model's assumptions and the output."""
    plan.add_argument("--bytes-per-token", type=float, default=4.0,
                      help="bytes read from storage per token (4)")
    plan.add_argument("--gpu", default="H100", help="GPU name in clusterlab.catalog.hardware (H100)")
    plan.add_argument("--gpus", type=int, help="GPUs in the cluster")
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--node-link", help="node interconnect in clusterlab.catalog.hardware.LINKS "
                                          "(default: the GPU's NVLink)")
    plan.add_argument("--fabric", default="IB-NDR", help="fabric link per NIC (IB-NDR)")
    plan.add_argument("--nics-per-node", type=int, help="fabric NICs per node (one per GPU)")
    plan.add_argument("--nvlink-domain", type=int, default=None, metavar="GPUS",
                      help="GPUs per NVLink domain where it spans hosts (72: an NVL72 rack of "
                           "4-GPU hosts, with --gpus-per-node 4); default: the node's GPUs")
    plan.add_argument("--storage-gb-s", type=float, default=20.0,
                      help="shared storage read throughput in GB/s (20)")
    plan.add_argument("--efficiency", type=float, default=None,
                      help="fraction of peak FLOP/s of every kernel (default: the library's "
                           "compute model, per GEMM)")
    plan.add_argument("--no-overlap", action="store_true",
                      help="reduce the gradients after the backward pass, none hidden "
                           "(default: in buckets during the last micro-batch's backward pass, "
                           "Megatron's overlap_grad_reduce)")
    plan.add_argument("--bucket-params", type=int, default=None,
                      help="parameters per gradient bucket (default: Megatron's "
                           "max(4e7, 1e6 x dp))")
    plan.add_argument("--reserve", type=float, default=0.1,
                      help="fraction of GPU memory kept free for workspace (0.1)")
    plan.add_argument("--top", type=int, default=10, help="layouts to show (10)")
    plan.add_argument("--include-unfit", action="store_true",
                      help="rank the layouts that do not fit in memory too, marked, instead "
                           "of refusing them")
    plan.add_argument("--json", action="store_true",
                      help='print {"plans": [...]} as JSON instead of tables')


def _integers(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} are comma-separated integers, e.g. 1,2,4; "
                                         f"got {text!r}") from None
    return values


def _positive_ints(text: str) -> tuple[int, ...]:
    values = _integers(text, "sizes")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"sizes must be positive, e.g. 1,2,4; got {text!r}")
    return values


def _zero_stages(text: str) -> tuple[int, ...]:
    values = _integers(text, "ZeRO stages")
    if any(v not in _SPACE.zero_stages for v in values):
        raise argparse.ArgumentTypeError(f"ZeRO stages are among 0,1,2,3; got {text!r}")
    return values


def _policies(text: str) -> tuple[str, ...]:
    values = tuple(text.split(","))
    known = RECOMPUTE_POLICIES
    if any(v not in known for v in values):
        raise argparse.ArgumentTypeError(f"recomputation policies are among {','.join(known)}; "
                                         f"got {text!r}")
    return values


def _moe(args: argparse.Namespace) -> plan.MoE | None:
    """The --experts options as a plan.MoE (None without --experts)."""
    extra = {"--top-k": args.top_k, "--expert-mlp": args.expert_mlp,
             "--moe-layers": args.moe_layers, "--capacity-factor": args.capacity_factor,
             "--load-imbalance": args.load_imbalance,
             "--clamped-activation": args.clamped_activation or None,
             "--expert-bias": args.expert_bias or None,
             "--recompute-expert-activation": args.recompute_expert_activation or None}
    if args.experts is None:
        given = [flag for flag, value in extra.items() if value is not None]
        if given:
            verb = "describes" if len(given) == 1 else "describe"
            raise ValueError(f"{', '.join(given)} {verb} experts: give --experts too (the "
                             f"number of experts per MoE layer), or drop them for a dense model.")
        return None
    if args.expert_mlp is None:
        raise ValueError("--experts needs --expert-mlp, the hidden width of one expert MLP "
                         "(Mixtral 8x7B: 14336).")
    imbalance = 1.0 if args.load_imbalance is None else args.load_imbalance
    if not imbalance >= 1:   # also refuses nan
        raise ValueError(f"--load-imbalance is the busiest expert's tokens over the mean, so "
                         f"at least 1; got {args.load_imbalance}: give 1 for a balanced router "
                         f"or the max / mean measured (e.g. 1.3).")
    return plan.MoE(args.experts, 2 if args.top_k is None else args.top_k, args.expert_mlp,
                    n_moe_layers=args.moe_layers,
                    capacity_factor=1.0 if args.capacity_factor is None
                    else args.capacity_factor, load_imbalance=imbalance,
                    activation_clamp=args.clamped_activation, expert_bias=args.expert_bias,
                    recompute_activation=args.recompute_expert_activation)


def _plan(args: argparse.Namespace) -> None:
    experts = _moe(args)
    n_params = args.params
    if n_params is None:
        missing = [flag for flag, value in (("--layers", args.layers),
                                            ("--d-model", args.d_model),
                                            ("--heads", args.heads)) if value is None]
        if missing:
            raise ValueError(f"Give --params, or the shape to count them from: "
                             f"{', '.join(missing)} missing (with --ffn, and --kv-heads and "
                             f"--vocab where the model has them).")
        n_params = plan.shape_params(args.layers, args.d_model, n_heads=args.heads,
                                     n_kv_heads=args.kv_heads, ffn_width=args.ffn,
                                     vocab_size=args.vocab, moe=experts)
    elif args.ffn is not None:
        raise ValueError("--ffn counts the parameters; with --params given it would be "
                         "ignored: drop one of them.")
    workload = plan.Workload(
        n_params, args.seq_len, args.batch, n_tokens=args.tokens,
        time_budget_s=None if args.budget_days is None else args.budget_days * 86400,
        n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
        n_kv_heads=args.kv_heads, vocab_size=args.vocab, bytes_per_token=args.bytes_per_token,
        moe=experts, precision=args.precision)
    space = plan.SearchSpace(micro_batches=args.micro_batches,
                             virtual_stages=args.virtual_stages,
                             recompute=args.recompute or _SPACE.recompute,
                             zero_stages=args.zero, cp=args.context_parallel,
                             ep=args.expert_parallel, pp=args.pipeline_parallel,
                             tp=args.tensor_parallel)
    assumptions = plan.Assumptions(compute_efficiency=args.efficiency,
                                   overlap_grad_reduce=not args.no_overlap,
                                   grad_bucket_params=args.bucket_params,
                                   activation_reserve=args.reserve)
    if args.gpus is None:
        if args.budget_days is None or args.tokens is None:
            raise ValueError("Give --gpus, or --tokens and --budget-days to size the cluster.")
        if args.nvlink_domain is not None:
            raise ValueError("--nvlink-domain needs --gpus: sizing tries powers of two of "
                             "nodes, which do not fill NVLink domains of "
                             f"{args.nvlink_domain} GPUs.")
        design = plan.cluster(args.gpu, args.gpus_per_node,
                              storage_read_bytes_per_s=args.storage_gb_s * 1e9,
                              gpus_per_node=args.gpus_per_node, node_link=args.node_link,
                              fabric_link=args.fabric, nics_per_node=args.nics_per_node)
        sized = plan.gpus_needed(workload, design, assumptions)
        if not args.json:
            print(f"# {sized.hardware.n_gpus} GPUs needed (whole nodes, a power of two of them)")
        cluster = sized.hardware
    else:
        cluster = plan.cluster(args.gpu, args.gpus,
                               storage_read_bytes_per_s=args.storage_gb_s * 1e9,
                               gpus_per_node=args.gpus_per_node, node_link=args.node_link,
                               fabric_link=args.fabric, nics_per_node=args.nics_per_node,
                               nvlink_domain_gpus=args.nvlink_domain)
    result = plan.search_layouts(workload, cluster, assumptions, space=space, limit=args.top,
                                 include_unfit=args.include_unfit)
    if args.json:
        import json

        print(json.dumps({"plans": [plan.plan_record(p) for p in result.plans]}, indent=1))
        return
    print(plan.describe_plan(result.plans[0]))
    print(f"# the {len(result.plans)} fastest layouts that fit"
          + (" (then those that do not, mem GB above the usable)" if args.include_unfit
             else "") + "; seconds per step")
    print(plan.format_plans(result.plans))
    print(plan.format_refusals(result))


def _bench(args: argparse.Namespace) -> None:
    from clusterlab.device import bench, devices  # JAX: only this subcommand runs devices

    if args.largest < args.smallest:
        raise ValueError(f"--max ({args.largest} B) is smaller than --min ({args.smallest} B).")
    used = devices.setup(args.devices)
    mesh = devices.mesh((args.devices,), ("devices",), used)
    sizes = bench.message_sizes(args.smallest, args.largest, args.factor)
    rows = bench.sweep(args.op, sizes, mesh, "devices", implementation=args.implementation,
                       dtype=args.dtype, warmup=args.warmup, repeats=args.repeats)
    print(f"# {args.op} ({args.implementation}) on {args.devices} x {used[0].platform} "
          f"{used[0].device_kind}; time is the median of {args.repeats}, spread the IQR")
    print(bench.format_table(rows))
    ceiling = bench.memcpy_bandwidth()
    if used[0].platform == "cpu":
        print(f"# host memcpy: {64 * 2**20 / ceiling.median_s / 1e9:.2f} GB/s "
              "(the ceiling for simulated devices)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "grade":
            from clusterlab.course import grading  # the grader's sandbox and notebook packages

            return grading.main(args.submissions, key_dir=args.key, timeout_s=args.timeout)
        if args.command == "bench":
            _bench(args)
        elif args.command == "plan":
            _plan(args)
        elif args.command == "expect":
            _expect(args)
        sys.stdout.flush()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): say nothing more. Python would flush stdout again
        # at exit and print a traceback, so point stdout at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
