"""Running one submitted notebook in a sandbox: Debian's bubblewrap and resource limits.

:func:`run_submission` copies the notebook alone into a temporary folder and runs
``python -m clusterlab.course.submission`` on it (:mod:`clusterlab.course.submission`) as the
unprivileged user ``nobody`` inside ``bwrap``: the whole file system read-only, the folders in
``hide`` (the keys, the submissions' folders, the instructor's home) replaced by empty ones, its
temporary folder the only writable place, no network (``--unshare-all``: no interface but a
down loopback), its own process and IPC namespaces, killed with the grader. ``setrlimit``
bounds its CPU time, address space, processes (a fork bomb stops at ``processes``) and file
size, and the grader's timeout its wall-clock time. A seccomp filter (:func:`seccomp_filter`)
refuses new user namespaces (no ``unshare -Urm``) and system calls a notebook has no use for;
``/tmp`` and ``/dev/shm`` are sized tmpfs. Where systemd runs, a cgroup caps the memory and
tasks of the whole submission (:func:`whole_submission_cap`); elsewhere the grader says once
per batch that it is missing. What it hands back is data (one JSON file).
"""

from __future__ import annotations

import ast
import errno
import functools
import importlib.util
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import clusterlab

_NOBODY = 65534
_BWRAP = "bwrap"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is not installed: grading refuses to run a submission unsandboxed."""


@dataclass(frozen=True)
class Limits:
    """A submission's limits.

    Attributes:
        cpu_s: CPU seconds, all threads together.
        memory_bytes: address space (JAX on CPU reserves about 2 GB of it at start).
        processes: processes and threads of the user ``nobody``.
        wall_s: the whole run, wall clock (None: no limit).
        file_bytes: the largest file it may write (RLIMIT_FSIZE).
        tmpfs_bytes: the size of each memory-backed folder it may write (``/tmp``, ``/dev/shm``).
    """

    cpu_s: int = 1800
    memory_bytes: int = 16 * 2**30
    processes: int = 512
    wall_s: float | None = 1800
    file_bytes: int = 256 * 2**20
    tmpfs_bytes: int = 64 * 2**20


def limited(limits: Limits) -> list[str]:
    """The command prefix (``prlimit``) that runs a command under ``limits``' CPU-time,
    address-space, process, file-size and core-dump limits."""
    # prlimit and setpriv (util-linux) as a command prefix, not a preexec_fn: the grader has JAX
    # loaded, and running Python between fork and exec in a multithreaded process can deadlock
    # the soft CPU limit sends SIGXCPU (the run ends with that signal's status), the hard one,
    # a few seconds on, SIGKILL should SIGXCPU be caught
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 5}", f"--as={limits.memory_bytes}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}", "--core=0", "--"]


def _as_nobody() -> list[str]:
    # inside the sandbox, once bwrap (as root) has laid out the mounts: RLIMIT_NPROC binds
    # only a user other than root, and nobody cannot write the read-only binds anyway
    return ["setpriv", f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups", "--"]


def _bwrap_command(work: Path, hide: Sequence[Path], binds: Sequence[str] = (),
                   tmpfs_bytes: int = Limits.tmpfs_bytes, seccomp_fd: int | None = None
                   ) -> list[str]:
    if shutil.which(_BWRAP) is None:
        raise SandboxUnavailable("grading runs each submission in bubblewrap, which is not "
                                 "installed: run tests/system_deps.sh (apt-get install "
                                 "bubblewrap).")
    # only what Python needs is bound, read-only: the system, the venv, the Python it was made
    # from and the library; the repository (its keys/), the homes and every other submission
    # are simply not there. ``hide`` empties any of them that one of those binds still holds.
    keep = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix,
                                        Path(clusterlab.__file__).parent.parent)}
    # the memory-backed folders are sized: a file there is memory no rlimit counts
    command = [_BWRAP, "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--dev", "/dev",
               "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm", "--proc", "/proc",
               "--size", str(tmpfs_bytes), "--tmpfs", "/tmp"]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/", link)
        if target.is_symlink():
            command += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            command += ["--ro-bind", str(target), str(target)]
    for folder in sorted(keep):
        command += [*_crossable_parents(folder), "--ro-bind", str(folder), str(folder)]
    for folder in sorted({Path(h).resolve() for h in hide}):
        if any(folder.is_relative_to(k) for k in keep):
            command += ["--tmpfs", str(folder)]
    return command + [*binds, *_crossable_parents(work), "--bind", str(work),
                      str(work), "--unshare-net", "--unshare-pid", "--unshare-ipc",
                      "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
                      "--new-session", "--chdir", str(work), "--setenv", "HOME", str(work),
                      "--setenv", "CLUSTERLAB_KEYS", "/nonexistent", "--setenv", "MPLBACKEND",
                      "Agg", *_as_nobody()]


def withheld_binds(names: Sequence[str], folder: Path) -> list[str]:
    """bwrap arguments that bind, over each module holding a function of ``names``
    (``"clusterlab.device.collectives.ring_reduce_scatter"``), a copy in ``folder`` whose named
    functions first call :func:`clusterlab.course.submission.refuse_unless_library`: while the
    answers are exported, a call made for the notebook (directly, or by JAX tracing the notebook's
    function) refuses, and one the library makes itself goes on. A module reloaded or executed
    from its source in the sandbox gets the guarded copy too, and each of its compiled
    ``__pycache__`` files is hidden (``/dev/null``), so no unguarded code is left.

    Raises:
        ValueError: when a name is not a module-level function of the library.
    """
    by_module: dict[str, list[str]] = {}
    for name in names:
        module, _, function = name.rpartition(".")
        by_module.setdefault(module, []).append(function)
    binds = []
    for module, functions in sorted(by_module.items()):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ValueError(f"cannot withhold {module}: it is not a module of the library.")
        source = Path(spec.origin)
        guarded = folder / f"{module}.py"
        guarded.write_text(_guarded_source(source.read_text(), module, functions))
        binds += ["--ro-bind", str(guarded), str(source)]
        for compiled in sorted((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc")):
            binds += ["--ro-bind", "/dev/null", str(compiled)]
    return binds


def _guarded_source(text: str, module: str, functions: Sequence[str]) -> str:
    """``text`` with a guard line before the first statement (after the docstring) of each of
    ``functions``; every other line as it was."""
    lines = text.splitlines(keepends=True)
    found = {node.name: node for node in ast.parse(text).body
             if isinstance(node, ast.FunctionDef) and node.name in functions}
    missing = sorted(set(functions) - set(found))
    if missing:
        raise ValueError(f"cannot withhold {module}.{missing[0]}: no such function in {module}.")
    # from the last function up, so that earlier line numbers stay right
    for node in sorted(found.values(), key=lambda n: n.lineno, reverse=True):
        body = node.body
        documented = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        first = body[1] if documented and len(body) > 1 else body[0]
        if first.lineno == node.lineno:
            raise ValueError(f"cannot withhold {module}.{node.name}: its body shares the def line.")
        guard = (" " * first.col_offset + "__import__('clusterlab.course.submission').course."
                 f"submission.refuse_unless_library({module + '.' + node.name!r})\n")
        lines.insert(first.lineno - 1, guard)
    return "".join(lines)


# The seccomp filter bwrap loads before it starts the submission (--seccomp FD): classic BPF over
# struct seccomp_data (nr at offset 0, arch at 4, the first argument's low word at 16), for
# x86_64 only; any other architecture gets no filter and says so (seccomp_unavailable).
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_CLONE_NEWUSER = 0x10000000
_CLONE, _UNSHARE, _CLONE3 = 56, 272, 435
# calls a notebook has no use for that reach into the kernel's less-trodden paths (flatpak's list,
# less what Python needs): ptrace, syslog, vhangup, pivot_root, chroot, acct, mount, umount2,
# swapon, swapoff, reboot, init/delete_module, quotactl, lookup_dcookie, kexec_load, add_key,
# request_key, keyctl, perf_event_open, name_to_handle_at, open_by_handle_at, setns,
# finit_module, kexec_file_load, bpf, userfaultfd, io_uring_*, the new mount API
_DENIED_X86_64 = (101, 103, 153, 155, 161, 163, 165, 166, 167, 168, 169, 175, 176, 179, 212,
                  246, 248, 249, 250, 298, 303, 304, 308, 313, 320, 321, 323, 425, 426, 427, 428,
                  429, 430, 431, 432, 433, 442)
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def seccomp_filter() -> bytes | None:
    """The sandbox's seccomp program (``struct sock_filter`` array), or None on an architecture
    it is not written for (:func:`seccomp_unavailable` says so).

    It refuses (EPERM) new user namespaces (``clone`` or ``unshare`` with ``CLONE_NEWUSER``: no
    ``unshare -Urm``, bubblewrap's ``--disable-userns`` without a user namespace of its own),
    ``clone3`` (ENOSYS: its flags sit in memory a filter cannot read; the C library falls back to
    ``clone``), x32 calls, and the calls of ``_DENIED_X86_64``; other architectures' calls kill.
    """
    if platform.machine() != "x86_64":
        return None
    deny, enosys, flags = "deny", "enosys", "flags"
    program: list[tuple[int, object, object, int]] = [
        (_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH_X86_64), (_RET, 0, 0, _KILL_PROCESS),
        (_LD_ABS, 0, 0, 0), (_JGE, deny, 0, _X32_SYSCALL_BIT)]
    program += [(_JEQ, deny, 0, number) for number in _DENIED_X86_64]
    program += [(_JEQ, flags, 0, _CLONE), (_JEQ, flags, 0, _UNSHARE), (_JEQ, enosys, 0, _CLONE3),
                (_RET, 0, 0, _ALLOW)]
    labels = {flags: len(program)}
    program += [(_LD_ABS, 0, 0, 16), (_JSET, deny, 0, _CLONE_NEWUSER), (_RET, 0, 0, _ALLOW)]
    labels[deny] = len(program)
    program.append((_RET, 0, 0, _ERRNO | errno.EPERM))
    labels[enosys] = len(program)
    program.append((_RET, 0, 0, _ERRNO | errno.ENOSYS))

    def offset(at: int, target) -> int:   # a jump counts from the next instruction
        return labels[target] - at - 1 if isinstance(target, str) else target

    return b"".join(struct.pack("<HBBI", code, offset(at, jt), offset(at, jf), k)
                    for at, (code, jt, jf, k) in enumerate(program))


def seccomp_unavailable() -> str:
    """Why the sandbox runs without a seccomp filter ("" when it has one)."""
    if seccomp_filter() is None:
        return (f"the sandbox's seccomp filter is written for x86_64, not {platform.machine()}: "
                "submissions may create user namespaces and make every system call")
    return ""


# what the grader does where no cgroup caps a whole submission, said with what is missing
_WITHOUT_CGROUP = ("instead each process keeps its own limits (address space, CPU time, file "
                   "size), processes are counted and /tmp and /dev/shm sized; processes together "
                   "may use more memory than one process's limit")
_PROBE_S = 30


@functools.cache
def whole_submission_cap() -> tuple[bool, str]:
    """Whether a cgroup can cap a whole submission's memory and tasks here
    (``systemd-run --scope -p MemoryMax= -p TasksMax=``), and if not, one line saying what is
    missing, how to get it and what the grader does instead; probed once per process."""
    missing = "no memory or task cap over a whole submission"
    if shutil.which("systemd-run") is None:
        return False, (f"{missing}: systemd-run is not installed (apt-get install systemd, on a "
                       f"host booted with systemd); {_WITHOUT_CGROUP}")
    try:
        probe = subprocess.run(["systemd-run", "--scope", "--quiet", "-p", "MemoryMax=64M",
                                "-p", "TasksMax=8", "true"], capture_output=True, text=True,
                               timeout=_PROBE_S)
    except subprocess.TimeoutExpired:
        return False, (f"{missing}: systemd-run did not answer within {_PROBE_S} s; "
                       f"{_WITHOUT_CGROUP}")
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"status {probe.returncode}"])[0][:160]
        return False, (f"{missing}: systemd-run cannot make a cgroup here ({why}): grade on a "
                       f"host where systemd runs as PID 1; {_WITHOUT_CGROUP}")
    return True, ""


def missing_protections() -> list[str]:
    """What this platform's sandbox lacks (no seccomp filter, no cgroup over a whole
    submission), one line each; empty when it has everything."""
    return [why for why in (seccomp_unavailable(), whole_submission_cap()[1]) if why]


def _capped(limits: Limits) -> list[str]:
    # The cgroup counts every process of the submission together, and memory rlimits do not
    # see: a tmpfs file, the page cache of its own writes.
    if not whole_submission_cap()[0]:
        return []
    return ["systemd-run", "--scope", "--quiet", "--collect", "-p",
            f"MemoryMax={limits.memory_bytes}", "-p", f"TasksMax={limits.processes}", "--"]


def _crossable_parents(folder: Path) -> list[str]:
    # bwrap makes a bind's missing parents with mode 0700, which nobody could not cross
    parents = [p for p in reversed(folder.parents) if p != Path("/")]
    return [arg for parent in parents for arg in ("--perms", "0755", "--dir", str(parent))]


def run_submission(notebook: Path, request: Mapping[str, object], *, cell_timeout_s: float,
                   hide: Sequence[Path] = (), limits: Limits | None = None,
                   withhold: Sequence[str] = ()) -> tuple[dict | None, str]:
    """Run one submission sandboxed and read back the data its last cell wrote.

    Args:
        notebook: the submitted ``.ipynb`` (copied; the original is never seen by it).
        request: ``{exercise id: [export request, ...]}`` for :func:`submission.report`.
        cell_timeout_s: the longest one cell may run.
        hide: folders it must not see besides the notebook's own and the home folder.
        limits: its limits (default :class:`Limits`).
        withhold: the course's own solutions of the exercises graded, by qualified name: in
            the sandbox they refuse the notebook's answers (:func:`withheld_binds`).

    Returns:
        ``(data, "")``, or ``(None, why)``: one line saying how the submission ended.

    Raises:
        SandboxUnavailable: when bubblewrap is missing.
    """
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="clusterlab-grade-") as folder:
        work = Path(folder) / "work"
        work.mkdir()
        copy = work / Path(notebook).name
        shutil.copyfile(notebook, copy)
        (work / "request.json").write_text(json.dumps(request))
        out = work / "answers.json"
        for path in (work, copy, work / "request.json"):
            os.chown(path, _NOBODY, _NOBODY)
        os.chmod(Path(folder), 0o755)
        guarded = Path(folder) / "withheld"
        guarded.mkdir()
        seccomp = seccomp_filter()
        filter_file = Path(folder) / "seccomp.bpf"
        filter_file.write_bytes(seccomp or b"")
        seccomp_fd = os.open(filter_file, os.O_RDONLY)
        command = _capped(limits) + limited(limits) + _bwrap_command(
            work, [*hide, Path(notebook).resolve().parent], withheld_binds(withhold, guarded),
            limits.tmpfs_bytes, seccomp_fd if seccomp else None) + [
            sys.executable, "-m", "clusterlab.course.submission", str(copy),
            str(work / "request.json"), str(out), str(cell_timeout_s)]
        # Its output goes to a file, not into the grader's memory (a notebook can print 1 GiB);
        # only the last line of its error stream is read back, to say how it ended.
        errors = Path(folder) / "stderr"
        try:
            with open(errors, "wb") as stderr:
                result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                        timeout=limits.wall_s, pass_fds=(seccomp_fd,),
                                        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except subprocess.TimeoutExpired:
            return None, f"the notebook ran past its {limits.wall_s:g} s wall-clock limit"
        finally:
            os.close(seccomp_fd)
        if out.exists() or out.is_symlink():
            return read_answers(out)
        return None, ended(result.returncode, tail(errors), limits)


def tail(path: Path, size: int = 4096) -> str:
    """The last ``size`` bytes of a file, as text."""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode("utf-8", "replace")


MAX_ANSWERS_BYTES = 64 * 2**20


def read_answers(path: Path) -> tuple[dict | None, str]:
    """The answers a submission wrote, taken as data: ``(answers, "")`` or ``(None, why)``.

    The file is the submission's: it is opened without following a link (a link could point at
    any host file, and the grader runs as root), read up to :data:`MAX_ANSWERS_BYTES`, and must
    be a JSON object that Python can parse (not nested past the parser's depth).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None, "the notebook's answers file is a link or cannot be opened"
    with os.fdopen(descriptor, "rb") as handle:
        raw = handle.read(MAX_ANSWERS_BYTES + 1)
    if len(raw) > MAX_ANSWERS_BYTES:
        return None, f"the notebook's answers file is over {MAX_ANSWERS_BYTES // 2**20} MiB"
    try:
        answers = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None, "the notebook's answers file is not JSON the grader can read"
    if not isinstance(answers, dict):
        return None, "the notebook's answers file is not a JSON object"
    return answers, ""


def ended(returncode: int, stderr: str, limits: Limits, what: str = "the notebook") -> str:
    """How a limited process ended, in one line: the limit it hit, the signal that killed it, or
    the last line of its error stream (``stderr``); ``what`` names it ("the notebook")."""
    last = (stderr.strip().splitlines() or [""])[-1][:200]
    # bwrap, the sandbox's init, exits 128 + N when its child dies of signal N
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return f"{what} ran past its CPU-time limit of {limits.cpu_s} s"
    number = -returncode if returncode < 0 else returncode - 128
    if number in signal.valid_signals():
        return f"{what} was killed by {signal.Signals(number).name} ({last})"
    return (f"{what} ended before reporting: {last.removeprefix('clusterlab: ')} "
            f"(status {returncode})")
