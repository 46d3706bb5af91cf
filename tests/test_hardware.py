"""clusterlab.catalog.hardware: every number has a source in references.bib, quotes are consistent,
lookups are case-insensitive."""

from __future__ import annotations

import dataclasses
import re

import pytest

from clusterlab.catalog import hardware
from conftest import ROOT

BIB_KEYS = set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(),
                          flags=re.MULTILINE))


def _catalog_entries():
    """Every entry of every catalog in hardware (GPUS, LINKS and any later ones, e.g. NODES)."""
    entries = []
    for table_name, table in vars(hardware).items():
        if (table_name.isupper() and isinstance(table, dict) and table
                and all(dataclasses.is_dataclass(v) for v in table.values())):
            entries += [pytest.param(key, value, id=f"{table_name}:{key}")
                        for key, value in table.items()]
    return entries


def test_bibliography_parses():
    assert "thakur2005" in BIB_KEYS and len(BIB_KEYS) >= 10


def test_catalogs_include_gpus_and_links():
    ids = {entry.id.split(":")[0] for entry in _catalog_entries()}
    assert {"GPUS", "LINKS"} <= ids


@pytest.mark.parametrize("key, entry", _catalog_entries())
def test_every_entry_cites_a_key_in_references_bib(key, entry):
    assert entry.name == key
    assert entry.source.strip(), f"{key} has no source"
    cited = re.findall(r"\[([A-Za-z0-9_:\-]+)\]", entry.source)
    assert cited, f"{key}: no [bibkey] in {entry.source!r}"
    missing = [c for c in cited if c not in BIB_KEYS]
    assert not missing, f"{key} cites {missing}, not in references.bib"


@pytest.mark.parametrize("name", list(hardware.GPUS))
def test_gpu_numbers_are_positive_and_si(name):
    spec = hardware.GPUS[name]
    assert spec.memory_bytes >= 16e9          # GB = 1e9 bytes, not GiB counts or GB floats
    assert spec.hbm_bytes_per_s >= 500e9
    assert spec.bf16_flops >= 1e14
    assert spec.nvlink_bytes_per_s >= 1e11


@pytest.mark.parametrize("name", list(hardware.GPUS))
def test_gpu_nvlink_matches_its_generation(name):
    spec = hardware.GPUS[name]
    assert spec.nvlink_bytes_per_s == hardware.LINKS[f"NVLink{spec.nvlink_generation}"].bytes_per_s


def _per_direction_from_quote(quoted: str) -> float:
    """Bytes/s per direction, recomputed from the vendor's own figure."""
    bidirectional = re.match(r"([\d.]+) (GB|TB)/s bidirectional", quoted)
    if bidirectional:
        value = float(bidirectional.group(1)) * {"GB": 1e9, "TB": 1e12}[bidirectional.group(2)]
        links = re.search(r"\((\d+) links x (\d+) GB/s\)", quoted)
        if links:  # the link count times the per-link figure is the same bidirectional total
            assert int(links.group(1)) * float(links.group(2)) * 1e9 == pytest.approx(value)
        return value / 2
    pcie = re.match(r"(\d+) GT/s per lane, 128b/130b encoding, (\d+) lanes", quoted)
    if pcie:  # transfers/s * lanes * payload fraction / 8 bits per byte
        return float(pcie.group(1)) * 1e9 * int(pcie.group(2)) * 128 / 130 / 8
    flit = re.match(r"(\d+) GT/s per lane, FLIT mode (\d+)/(\d+), (\d+) lanes", quoted)
    if flit:  # PCIe 6.0: PAM4 symbols carry the GT/s, a fixed share of each flit is payload
        return (float(flit.group(1)) * 1e9 * int(flit.group(4)) / 8
                * int(flit.group(2)) / int(flit.group(3)))
    network = re.match(r"(\d+) Gb/s per port", quoted)
    if network:  # bits, not bytes
        return float(network.group(1)) * 1e9 / 8
    raise AssertionError(f"cannot read the quote {quoted!r}")


@pytest.mark.parametrize("name", list(hardware.LINKS))
def test_link_per_direction_matches_the_quote(name):
    link = hardware.LINKS[name]
    assert link.bytes_per_s == pytest.approx(_per_direction_from_quote(link.quoted), rel=2e-3)


def test_hand_checked_link_figures():
    # NVLink4: 900 GB/s is the bidirectional sum, 450 GB/s each way.
    assert hardware.link("NVLink4").bytes_per_s == 900e9 / 2
    assert hardware.link("NVLink5").bytes_per_s == 1.8e12 / 2
    # NDR InfiniBand: 400 Gb/s = 50 GB/s.
    assert hardware.link("IB-NDR").bytes_per_s == 400e9 / 8
    # PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s per direction.
    assert hardware.link("PCIe5x16").bytes_per_s == pytest.approx(32e9 * 16 * 128 / 130 / 8,
                                                                  rel=1e-3)


def test_derived_gpu_figures_follow_their_sources():
    # H100 datasheet: 1,979 TFLOPS BF16 with 2:4 sparsity, half of it dense.
    assert hardware.gpu("H100").bf16_flops == pytest.approx(1979e12 / 2, rel=1e-3)
    # DGX B200 datasheet, divided over its 8 GPUs; 72 PFLOPS FP8 sparse -> /2 dense -> /2 BF16.
    b200 = hardware.gpu("B200")
    assert b200.marketed_memory_bytes == pytest.approx(1440e9 / 8)
    # nvidia-smi: 183,359 MiB (TensorRT-LLM#10278); H200 143,771 MiB (Belotti, Modal)
    assert b200.memory_bytes == 183359 * 2**20
    assert hardware.gpu("H200").memory_bytes == 143771 * 2**20
    assert b200.hbm_bytes_per_s == pytest.approx(64e12 / 8)
    assert b200.bf16_flops == pytest.approx(72e15 / 8 / 2 / 2)


@pytest.mark.parametrize("query, key", [("h100", "H100"), ("H100", "H100"), ("a100", "A100"),
                                        ("b200", "B200")])
def test_gpu_lookup_is_case_insensitive(query, key):
    assert hardware.gpu(query) is hardware.GPUS[key]


@pytest.mark.parametrize("query, key", [("nvlink4", "NVLink4"), ("NVLINK4", "NVLink4"),
                                        ("ib-ndr", "IB-NDR"), ("pcie5X16", "PCIe5x16"),
                                        ("ETHERNET-400G", "Ethernet-400G")])
def test_link_lookup_is_case_insensitive(query, key):
    assert hardware.link(query) is hardware.LINKS[key]


def test_unknown_gpu():
    with pytest.raises(ValueError, match=r"Unknown GPU 'H300'\. Known GPUs: V100, A100, H100"):
        hardware.gpu("H300")


def test_unknown_link():
    with pytest.raises(ValueError, match=r"Unknown link 'NVLink9'\. Known links: NVLink2, "
                                         r"NVLink3"):
        hardware.link("NVLink9")
    with pytest.raises(ValueError, match=r"Unknown link ''"):
        hardware.link("")


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.gpu("H100").bf16_flops = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.link("NVLink4").bytes_per_s = 0.0


def test_each_gpu_names_its_pcie_generation():
    # The GPU's host link bounds the NIC traffic it can drive (costmodel.cluster_collective).
    expected = {"V100": "PCIe3x16", "A100": "PCIe4x16", "H100": "PCIe5x16", "H200": "PCIe5x16",
                "B200": "PCIe5x16", "GB200": "PCIe5x16", "GB300": "PCIe6x16"}
    assert {name: spec.pcie for name, spec in hardware.GPUS.items()} == expected
    for spec in hardware.GPUS.values():
        assert hardware.link(spec.pcie).bytes_per_s < spec.nvlink_bytes_per_s
    for name in ("V100", "A100"):
        assert "PCIe Gen" in hardware.gpu(name).source


def test_fp8_peaks_follow_their_sources():
    # H100/H200 datasheets: 3,958 TFLOPS FP8 with sparsity; dense is half.
    for name in ("H100", "H200"):
        assert hardware.peak_flops(name, precision="fp8") == pytest.approx(3958e12 / 2, rel=1e-3)
    # DGX B200: 72 PFLOPS FP8 sparse for 8 GPUs. NVL72 racks: 720 PFLOPS FP8 sparse for 72.
    assert hardware.gpu("B200").fp8_flops == pytest.approx(72e15 / 8 / 2)
    for name in ("GB200", "GB300"):
        assert hardware.gpu(name).fp8_flops == pytest.approx(720e15 / 72 / 2)
        assert hardware.gpu(name).bf16_flops == pytest.approx(360e15 / 72 / 2)
    # GB200 NVL72: 13.4 TB and 576 TB/s of HBM3e for 72 GPUs (MLPerf lists 186 GB per GPU).
    assert hardware.gpu("GB200").memory_bytes == pytest.approx(186e9, rel=1e-3)
    assert hardware.gpu("GB300").hbm_bytes_per_s == pytest.approx(8e12)


@pytest.mark.parametrize("name", [n for n, g in hardware.GPUS.items() if g.fp8_flops is not None])
def test_fp8_is_twice_dense_bf16(name):
    # Every FP8 tensor core catalogued here doubles the dense BF16 rate; a sparse figure
    # copied by mistake would make it four times.
    spec = hardware.gpu(name)
    assert spec.fp8_flops == pytest.approx(2 * spec.bf16_flops, rel=2e-3)


def test_peak_flops_precisions_and_errors():
    assert hardware.peak_flops("A100") == hardware.gpu("A100").bf16_flops
    assert hardware.peak_flops(hardware.gpu("H100"), precision="bf16") == 989e12
    with pytest.raises(ValueError, match=r"A100 has no FP8 tensor cores; FP8 needs one of: H100"):
        hardware.peak_flops("A100", precision="fp8")
    with pytest.raises(ValueError, match=r"precision must be 'bf16' or 'fp8', got 'fp4'"):
        hardware.peak_flops("B200", precision="fp4")


def test_gpu_power_from_datasheets():
    assert {name: spec.tdp_w for name, spec in hardware.GPUS.items()} == {
        "V100": 300.0, "A100": 400.0, "H100": 700.0, "H200": 700.0, "B200": 1000.0,
        "GB200": None, "GB300": None}


def test_node_power_and_the_dgx_h200():
    assert hardware.node("DGX H100").max_power_w == 10.2e3
    assert hardware.node("dgx h200").gpu == "H200"
    assert hardware.node("DGX B200").max_power_w == 14.3e3
    # The server's watts per GPU exceed the GPU's own TDP: CPUs, NICs, NVSwitches and fans.
    for spec in hardware.NODES.values():
        per_gpu = hardware.power_per_gpu_w(spec)
        assert per_gpu == spec.max_power_w / spec.gpus_per_node
        assert hardware.gpu(spec.gpu).tdp_w < per_gpu < 2.5 * hardware.gpu(spec.gpu).tdp_w


def test_nvl72_racks_are_one_nvlink_domain_of_72_gpus():
    for name in ("GB200 NVL72", "gb300 nvl72"):
        spec = hardware.rack(name)
        assert spec.compute_trays * spec.gpus_per_tray == spec.nvlink_domain_gpus == 72
        assert spec.nvlink_switch_trays == 9
        assert hardware.gpu(spec.gpu).nvlink_generation == 5
        assert hardware.nvlink_domain_gpus(spec) == 72
        # 72 GPUs x 1.8 TB/s bidirectional = the datasheets' 130 TB/s NVLink (129.6).
        assert (spec.nvlink_domain_gpus * 2 * hardware.scale_up_bytes_per_s(spec)
                == pytest.approx(130e12, rel=5e-3))
    assert hardware.nvlink_domain_gpus("DGX H100") == 8
    with pytest.raises(ValueError, match=r"Unknown rack 'NVL576'\. Known racks: GB200 NVL72"):
        hardware.rack("NVL576")


def test_scale_up_over_scale_out():
    # DGX H100: 450 GB/s NVLink against one 400 Gb/s (50 GB/s) NIC per GPU.
    assert hardware.scale_out_bytes_per_s("DGX H100") == 50e9
    assert hardware.scale_up_over_scale_out("DGX H100") == pytest.approx(9.0)
    # GB200 NVL72: 900 GB/s against 50 GB/s; GB300 NVL72: against an 800 Gb/s NIC.
    assert hardware.scale_up_over_scale_out("GB200 NVL72") == pytest.approx(18.0)
    assert hardware.scale_up_over_scale_out("GB300 NVL72") == pytest.approx(9.0)
    with pytest.raises(ValueError, match=r"Unknown system 'DGX-2': name a server"):
        hardware.scale_up_bytes_per_s("DGX-2")


def test_rack_power():
    # SuperPOD GB200 RA: 1.2 MW for a scalable unit of 8 racks.
    assert hardware.rack("GB200 NVL72").power_w == pytest.approx(150e3)
    assert hardware.power_per_gpu_w("GB200 NVL72") == pytest.approx(150e3 / 72)
    with pytest.raises(ValueError, match=r"GB300 NVL72 has no power figure .* GB200 NVL72"):
        hardware.power_per_gpu_w("GB300 NVL72")


def test_fp8_ridge_point_is_twice_the_bf16_one():
    assert hardware.ridge_point("H100", precision="fp8") == pytest.approx(
        2 * hardware.ridge_point("H100"), rel=2e-3)
    with pytest.raises(ValueError, match="V100 has no FP8 tensor cores"):
        hardware.ridge_point("V100", precision="fp8")


def test_storage_network_is_a_fraction_of_the_back_end():
    # DGX H100: two storage/in-band cards counted at one 400 Gb/s port each, against 8 x 400 Gb/s.
    assert hardware.storage_network_bytes_per_s("DGX H100") == 100e9
    for spec in hardware.NODES.values():
        hardware.link(spec.storage_nic)
        back_end = hardware.scale_out_bytes_per_s(spec) * spec.gpus_per_node
        assert hardware.storage_network_bytes_per_s(spec) == pytest.approx(back_end / 4)
    with pytest.raises(ValueError, match="the catalog has no storage NICs for racks"):
        hardware.storage_network_bytes_per_s(hardware.rack("GB200 NVL72"))
    with pytest.raises(ValueError, match="Unknown node 'GB200 NVL72'"):
        hardware.storage_network_bytes_per_s("GB200 NVL72")


def test_reference_fabric_is_named_for_what_it_is():
    pod = hardware.fabric("SuperPOD B200 4SU")
    assert isinstance(pod, hardware.ReferenceFabric)
    assert pod.nodes_per_group * pod.n_groups == 128   # 4 SUs of 32 DGX B200


def test_memory_is_the_measured_total_where_a_source_gives_it():
    # nvidia-smi's totals in MiB (H100: NVIDIA/nccl#1264 and modal-client PR 2797; A100 80GB: the PR).
    for name, mib, marketed_gb in (("H100", 81559, 80), ("A100", 81920, 80)):
        spec = hardware.gpu(name)
        assert spec.memory_bytes == mib * 2**20
        assert spec.marketed_memory_bytes == marketed_gb * 1e9
        assert "nvidia-smi" in spec.source and f"{mib:,} MiB" in spec.source
    assert hardware.gpu("H100").memory_bytes / 2**30 == pytest.approx(79.65, abs=0.01)
    # Without a measured total the marketed figure stays, and the source says so.
    for spec in hardware.GPUS.values():
        assert spec.memory_bytes >= spec.marketed_memory_bytes
        if spec.memory_bytes == spec.marketed_memory_bytes:
            assert "no nvidia-smi total" in spec.source, spec.name


def test_a_cluster_of_nvl72_racks_spans_hosts_with_its_nvlink_domain():
    two = hardware.ClusterSpec.from_rack("GB200 NVL72", n_racks=2)
    assert (two.n_nodes, two.gpus_per_node, two.nics_per_node) == (36, 4, 4)
    assert (two.gpus_per_nvlink_domain, two.n_nvlink_domains) == (72, 2)
    assert "in 2 NVLink domains of 72" in two.describe()
    # A run inside one rack (2 hosts) lies in one domain of its 8 GPUs.
    part = hardware.ClusterSpec("GB300", n_nodes=2, gpus_per_node=4, nic="IB-XDR",
                                nvlink_domain_gpus=72)
    assert (part.gpus_per_nvlink_domain, part.n_nvlink_domains) == (8, 1)
    # Without a multi-host domain the domain is the host.
    dgx = hardware.ClusterSpec.from_node("DGX H100", n_nodes=4)
    assert (dgx.gpus_per_nvlink_domain, dgx.n_nvlink_domains) == (8, 4)


def test_an_nvlink_domain_must_hold_whole_hosts_and_fill_the_cluster():
    with pytest.raises(ValueError, match="not a whole number of hosts of 4 GPUs; give a "
                                         "multiple of gpus_per_node"):
        hardware.ClusterSpec("GB200", n_nodes=18, gpus_per_node=4, nic="IB-NDR",
                             nvlink_domain_gpus=70)
    with pytest.raises(ValueError, match="100 GPUs do not fill NVLink domains of 72; give a "
                                         "node count that fills whole domains \\(18 hosts"):
        hardware.ClusterSpec("GB200", n_nodes=25, gpus_per_node=4, nic="IB-NDR",
                             nvlink_domain_gpus=72)
