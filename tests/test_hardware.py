"""clusterlab.hardware: every number has a source in references.bib, quotes are consistent,
lookups are case-insensitive."""

from __future__ import annotations

import dataclasses
import re

import pytest

from clusterlab import hardware
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
    assert b200.memory_bytes == pytest.approx(1440e9 / 8)
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
                "B200": "PCIe5x16"}
    assert {name: spec.pcie for name, spec in hardware.GPUS.items()} == expected
    for spec in hardware.GPUS.values():
        assert hardware.link(spec.pcie).bytes_per_s < spec.nvlink_bytes_per_s
    for name in ("V100", "A100"):
        assert "PCIe Gen" in hardware.gpu(name).source
