"""The command line ``python -m clusterlab bench``, end to end in fresh processes, and its
argument errors."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from clusterlab.course import cli as cli
from conftest import ROOT, run_python

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+([\d.]+)\s+(\d+)%\s+([\d.]+)\s+([\d.]+)\s*$")
HEADER = ["size", "(B)", "count", "type", "time", "(us)", "spread", "algbw", "(GB/s)", "busbw",
          "(GB/s)"]


def _table(stdout: str) -> list[tuple[int, int, str, float, float, float]]:
    """(size, count, type, time_us, algbw, busbw) per row, after checking the header."""
    lines = stdout.splitlines()
    header_at = [i for i, line in enumerate(lines) if line.split() == HEADER]
    assert len(header_at) == 1, stdout
    rows = []
    for line in lines[header_at[0] + 1:]:
        if line.startswith("#"):
            break
        match = ROW.match(line)
        assert match, f"not a table row: {line!r}"
        size, count, dtype, time_us, _, algbw, busbw = match.groups()
        rows.append((int(size), int(count), dtype, float(time_us), float(algbw), float(busbw)))
    return rows


def _check_rows(rows, sizes, counts, dtype, factor):
    assert [r[0] for r in rows] == sizes
    assert [r[1] for r in rows] == counts
    for size, count, row_dtype, time_us, algbw, busbw in rows:
        assert row_dtype == dtype
        assert time_us > 0
        # algbw = size / time, in GB/s (1e9 bytes/s); the table rounds to 3 decimals
        assert algbw == pytest.approx(size / (time_us * 1e-6) / 1e9, rel=2e-3, abs=1e-3)
        # busbw = algbw * busbw factor, each rounded to 3 decimals
        assert busbw == pytest.approx(algbw * factor, abs=(1 + factor) * 5e-4 + 1e-9)


def test_bench_all_reduce_end_to_end():
    result = run_python("-m", "clusterlab", "bench", "all_reduce", "--devices", "4", "--min",
                        "4K", "--max", "64K", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # devices.setup says what runs where: 4 accelerators, or 4 simulated CPU devices
    assert out.startswith("Using 4 ") or "using 4 simulated CPU devices" in out.splitlines()[0]
    header = re.search(r"^# all_reduce \(builtin\) on 4 x (\w+) .*median of 2", out, re.MULTILINE)
    assert header, out
    rows = _table(out)
    # all-reduce: count = size / 4 bytes per float32
    _check_rows(rows, [4096, 8192, 16384, 32768, 65536], [1024, 2048, 4096, 8192, 16384],
                "float32", 2 * (4 - 1) / 4)
    # simulated devices: the host's memcpy speed is printed as their ceiling
    memcpy = re.search(r"^# host memcpy: [\d.]+ GB/s", out, re.MULTILINE)
    assert bool(memcpy) == (header.group(1) == "cpu")


def test_bench_ring_all_gather_bfloat16_end_to_end():
    result = run_python("-m", "clusterlab", "bench", "all_gather", "--devices", "8",
                        "--min", "1K", "--max", "16K", "--factor", "4", "--dtype", "bfloat16",
                        "--implementation", "ring", "--warmup", "1", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert "# all_gather (ring) on 8 x " in result.stdout
    # all-gather: nccl-tests' count is per device, size / 2 bytes per bfloat16 / 8 devices
    _check_rows(_table(result.stdout), [1024, 4096, 16384],
                [1024 // 2 // 8, 4096 // 2 // 8, 16384 // 2 // 8], "bfloat16", (8 - 1) / 8)


def test_bench_rejects_a_size_that_is_not_a_number():
    result = run_python("-m", "clusterlab", "bench", "all_reduce", "--min", "4Q")
    assert result.returncode == 2
    assert ("argument --min: Cannot read '4Q' as a size in bytes; write a number with an "
            "optional K, M, G or T") in result.stderr
    assert result.stdout == ""


def test_bench_rejects_an_unknown_op():
    result = run_python("-m", "clusterlab", "bench", "all_reduse")
    assert result.returncode == 2
    assert "argument op: invalid choice: 'all_reduse'" in result.stderr
    assert "all_reduce" in result.stderr  # the choices are listed


# In-process: argument errors are found before any device is set up, and a run on the eight
# devices the tests share is allowed.

@pytest.mark.parametrize("argv, message", [
    (["bench", "all_reduce", "--max", "4M4"], "argument --max: Cannot read '4M4'"),
    (["bench", "all_reduce", "--min", "0"], "argument --min: A size must be a positive whole"),
    (["bench", "reduce"], "argument op: invalid choice: 'reduce'"),
    (["bench", "all_reduce", "--implementation", "tree"], "argument --implementation: invalid "
                                                          "choice: 'tree'"),
    (["bench", "all_reduce", "--devices", "four"], "argument --devices: invalid int value"),
    (["benchmark"], "invalid choice: 'benchmark'"),
    (["expect", "all_reduce", "--gpu", "H100", "--nodes", "2", "--fabric", "Infiniband"],
     "argument --fabric: invalid choice: 'Infiniband'"),
    (["expect", "all_reduce", "--gpu", "H100", "--nodes", "1", "--algorithm", "nvlstree"],
     "argument --algorithm: invalid choice: 'nvlstree'"),
    ([], "the following arguments are required: command"),
])
def test_argument_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["bench", "all_reduce", "--min", "64K", "--max", "4K"],
     "error: --max (4096 B) is smaller than --min (65536 B)."),
    (["bench", "all_reduce", "--devices", "0"],
     "error: setup(n_devices) needs a positive whole number of devices, got 0."),
    (["bench", "all_reduce", "--devices", "8", "--min", "1K", "--max", "1K", "--repeats", "0"],
     "error: Need warmup >= 0 and repeats >= 1, got warmup=2, repeats=0."),
    (["bench", "all_gather", "--devices", "8", "--min", "4", "--max", "4"],
     "error: all_gather of 4 bytes on 8 devices needs a multiple of 32 bytes"),
    (["bench", "all_reduce", "--devices", "8", "--min", "1K", "--max", "1K",
      "--implementation", "recursive_doubling", "--dtype", "int32", "--factor", "1"],
     "error: The step factor must be at least 2, got 1."),
])
def test_value_errors_return_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_main_runs_in_process_on_the_shared_devices(capsys):
    assert cli.main(["bench", "send_recv", "--devices", "8", "--min", "1K", "--max", "2K",
                     "--warmup", "1", "--repeats", "1"]) == 0
    rows = _table(capsys.readouterr().out)
    _check_rows(rows, [1024, 2048], [1024 // 4, 2048 // 4], "float32", 1.0)


def test_plan_and_expect_start_without_jax():
    # JAX is blocked in the process: `plan`, `expect` and `--help` must not import it.
    blocked = ("import sys, runpy; sys.modules['jax'] = None; "
               "sys.argv = ['clusterlab', *sys.argv[1:]]; ")
    for argv in (["--help"], ["plan", "--help"], ["expect", "--help"],
                 ["plan", "--params", "7e9", "--tokens", "1e11", "--gpu", "H100", "--gpus", "64"],
                 ["expect", "all_reduce", "--gpu", "H100", "--nodes", "2"]):
        result = run_python("-c", blocked + "runpy.run_module('clusterlab', run_name='__main__')",
                            *argv)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stdout


def test_a_closed_pipe_ends_quietly():
    # `python -m clusterlab plan ... | head -1`: the reader goes away after one line, while the
    # planner still has about 100 kB to print (more than a pipe and Python's buffer hold)
    process = subprocess.Popen(
        [sys.executable, "-m", "clusterlab", "plan", "--params", "70e9", "--tokens", "2e12",
         "--gpu", "H100", "--gpus", "1024", "--top", "100000"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its line
    stderr = process.stderr.read()
    assert process.wait(timeout=120) in (0, 1)
    assert first.startswith("workload:")
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
