"""``python -m clusterlab expect``: expected nccl-tests busbw, and verdicts on published outputs.

Fixtures (tests/data, each with its source in its first lines):

* ``nccl_tests_a100_1node_stas00.txt``: a healthy sweep, nccl-tests on one 8x A100 node
  (stas00/ml-engineering), 32 KiB to 16 GiB.
* ``nccl_tests_h100_3nodes_nccl1453.txt``: an unhealthy one, 3 nodes of 8 H100 (NCCL issue
  1453, "Poor NCCL allreduce performance"), whose busbw collapses from 29.5 GB/s at 32 MiB to
  about 5 GB/s from 64 MiB up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterlab import __main__ as cli
from clusterlab import costmodel
from conftest import run_python

DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "nccl_tests_a100_1node_stas00.txt"
UNHEALTHY = DATA / "nccl_tests_h100_3nodes_nccl1453.txt"


def _json(capsys, *argv):
    assert cli.main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


# --- Parsing nccl-tests outputs ------------------------------------------------------------------

def test_parse_the_full_format_with_mpirun_tags():
    rows = cli.parse_nccl_tests(UNHEALTHY.read_text())
    assert rows[0] == (1048576, 1.24)           # out-of-place busbw, not the in-place 0.87
    assert rows[1] == (2097152, 1.73)           # (in-place was 9.65)
    assert rows[-1] == (536870912, 5.31)
    assert len(rows) == 10


def test_parse_a_trimmed_table_by_its_header():
    rows = cli.parse_nccl_tests(HEALTHY.read_text())
    assert rows[0] == (32768, 1.31) and rows[-1] == (17179869184, 234.89)
    assert len(rows) == 20


def test_parse_the_plain_nccl_tests_row():
    # OCI's BM.GPU4.8 tutorial (oracle/oci-hpc), one size, 2 nodes of 8 A100: out-of-place
    # busbw 222.88, in-place 218.96.
    line = (" 10737418240    2684354560     float     sum      -1    90330  118.87  222.88      0"
            "    91945  116.78  218.96      0")
    assert cli.parse_nccl_tests(line) == [(10737418240, 222.88)]


def test_parse_finds_nothing_in_other_text():
    assert cli.parse_nccl_tests("hello\n# size busbw\n12 apples\n") == []


# --- Expected busbw ------------------------------------------------------------------------------

def test_expected_rows_follow_cluster_collective(capsys):
    rows = _json(capsys, "expect", "all_reduce", "--gpu", "H100", "--nodes", "4",
                 "--sizes", "1M,64M,1G")
    assert [r["size_bytes"] for r in rows] == [2**20, 2**26, 2**30]
    for row in rows:
        est = costmodel.cluster_collective("all_reduce", row["size_bytes"], gpu="H100",
                                           n_nodes=4, nic="IB-NDR", nics_per_node=8)
        assert row["expected_busbw_gbps"] == pytest.approx(est.busbw / 1e9, abs=0.01)
        assert row["low_gbps"] < row["expected_busbw_gbps"] <= row["high_gbps"]
        assert row["algorithm"] == f"{est.algorithm}/{est.protocol}"
        assert row["measured_busbw_gbps"] is None and row["verdict"] is None
    assert set(rows[0]) == {"size_bytes", "expected_busbw_gbps", "low_gbps", "high_gbps",
                            "algorithm", "measured_busbw_gbps", "verdict"}


def test_table_output_end_to_end():
    result = run_python("-m", "clusterlab", "expect", "all_gather", "--gpu", "A100",
                        "--nodes", "2", "--nic", "IB-HDR", "--sizes", "16M,1G")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# expected all_gather on 2 x 8 A100, 8 x IB-HDR per node")
    assert [line.split()[0] for line in lines[2:]] == ["16777216", "1073741824"]


# --- Verdicts on published outputs ---------------------------------------------------------------

def test_healthy_published_sweep_is_normal_at_every_size(capsys):
    rows = _json(capsys, "expect", "all_reduce", "--gpu", "A100", "--nodes", "1",
                 "--measured", str(HEALTHY))
    assert len(rows) == 20
    assert {r["verdict"] for r in rows} == {"normal"}
    assert rows[-1]["measured_busbw_gbps"] == 234.89


def test_unhealthy_published_sweep_is_low_where_it_collapses(capsys):
    # Judged as DGX H100 nodes (8 NDR NICs): every size from 64 MiB up is low, with causes.
    rows = _json(capsys, "expect", "all_reduce", "--gpu", "H100", "--nodes", "3",
                 "--measured", str(UNHEALTHY))
    big = [r for r in rows if r["size_bytes"] >= 64 * 2**20]
    assert len(big) == 4
    assert all(r["verdict"].startswith("low: ") for r in big)
    assert "NCCL_IB_HCA" in big[0]["verdict"] and "GPUDirect RDMA" in big[0]["verdict"]


def test_unhealthy_sweep_is_low_even_on_the_weakest_fabric(capsys):
    # The NICs are not stated in the issue; even one 100GbE per node expects ~11.7 GB/s at
    # 512 MiB, and 4-5 GB/s is below the band; 4-32 MiB beat one 100G NIC's line rate, so the
    # cluster has more than that: the collapse is a fault, not a slow fabric.
    rows = _json(capsys, "expect", "all_reduce", "--gpu", "H100", "--nodes", "3",
                 "--nic", "Ethernet-100G", "--nics-per-node", "1", "--measured", str(UNHEALTHY))
    by_size = {r["size_bytes"]: r["verdict"] for r in rows}
    assert by_size[256 * 2**20].startswith("low") and by_size[512 * 2**20].startswith("low")
    assert by_size[32 * 2**20].startswith("high")


def test_above_line_rate_is_high(capsys, tmp_path):
    # The OCI row above: 222.88 GB/s on 2 nodes of 8 A100 is above a ring's line rate with
    # 8 HDR NICs per node (200 GB/s): a 2-node tree or in-network reduction.
    log = tmp_path / "oci.log"
    log.write_text(" 10737418240    2684354560     float     sum      -1    90330  118.87  "
                   "222.88      0    91945  116.78  218.96      0\n")
    rows = _json(capsys, "expect", "all_reduce", "--gpu", "A100", "--nodes", "2", "--nic",
                 "IB-HDR", "--measured", str(log))
    assert rows[0]["verdict"].startswith("high: above line rate")


# --- Bad input: one line naming the fix -----------------------------------------------------------

def test_a_log_of_another_collective_is_refused(capsys, tmp_path):
    log = tmp_path / "ag.log"
    log.write_text("# Collective test starting: all_gather_perf\n" + UNHEALTHY.read_text())
    assert cli.main(["expect", "all_reduce", "--gpu", "H100", "--nodes", "3", "--measured",
                     str(log)]) == 2
    assert "is an all_gather_perf output; judge it with 'expect all_gather'" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "X100", "--nodes", "1"], "--gpu X100: Unknown GPU 'X100'. Known GPUs: V100"),
    (["--gpu", "H100", "--nodes", "2", "--nic", "IB-QDR"], "--nic IB-QDR: Unknown link"),
    (["--gpu", "H100", "--nodes", "1", "--sizes", "64M,1M"], "--sizes must increase"),
    (["--gpu", "H100", "--nodes", "1", "--sizes", "1Q"], "Cannot read '1Q' as a size"),
    (["--gpu", "H100", "--nodes", "1", "--measured", "/no/such/file"], "Cannot read /no/such"),
    (["--gpu", "H100", "--nodes", "1", "--measured", str(DATA.parent.parent / "pyproject.toml")],
     "holds no nccl-tests table"),
    (["--gpu", "H100", "--nodes", "0"], "positive integers"),
])
def test_bad_input_gets_one_line(capsys, argv, message):
    assert cli.main(["expect", "all_reduce", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
