"""What a launcher and the processes it starts agree on: variables, exit codes, errors, ports.

:mod:`clusterlab.device.launch` (outside the processes) sets these variables and reads these exit
codes; :mod:`clusterlab.device.distributed` (inside each process) reads the variables and exits with
the codes. Both import this module and neither imports the other's internals, so that starting
processes and joining them stay two modules with no import circle.
:mod:`clusterlab.device.distributed` re-exports every public name here, since this module is
private.
"""

from __future__ import annotations

import importlib
import socket
from typing import Any, Callable

from clusterlab import _checks

LOOPBACK = "127.0.0.1"

# What the launcher tells each process (read by init()).
ENV_COORDINATOR = "CLUSTERLAB_COORDINATOR"          # "127.0.0.1:PORT"
ENV_NUM_PROCESSES = "CLUSTERLAB_NUM_PROCESSES"
ENV_PROCESS_ID = "CLUSTERLAB_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "CLUSTERLAB_DEVICES_PER_PROCESS"
ENV_HEARTBEAT_TIMEOUT_S = "CLUSTERLAB_HEARTBEAT_TIMEOUT_S"
ENV_INIT_TIMEOUT_S = "CLUSTERLAB_INIT_TIMEOUT_S"
ENV_RESULTS_DIR = "CLUSTERLAB_RESULTS_DIR"
# On a SLURM cluster: the coordinator's port (JAX's own rule derives one from the job id).
ENV_PORT = "CLUSTERLAB_PORT"

# Exit code of a process that gave up waiting for the others to join.
EXIT_INIT_TIMEOUT = 3


class DistributedError(RuntimeError):
    """A multi-process run could not start or did not finish; the message says why."""


class PortInUseError(DistributedError):
    """The coordinator's port on the loopback address is taken by another program."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    """Raise :class:`PortInUseError` unless ``port`` on 127.0.0.1 can be bound now."""
    port = _checks.count("port", port)
    if port > 65535:
        raise ValueError(f"A TCP port is at most 65535, got {port}.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError as error:
            raise PortInUseError(
                f"Port {port} on {LOOPBACK} is already in use ({error.strerror}), so the "
                "coordinator cannot listen there. Another job (or a process left from an "
                "earlier run) holds it: pass port=None to let clusterlab pick a free one."
            ) from None


def resolve(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function; a clear error when it is not there."""
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"A target is 'package.module:function', got {target!r}.")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise ValueError(f"{module_name} has no function {function_name!r}.")
    return function
