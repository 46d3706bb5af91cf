"""Shared set-up for the unit tests of clusterlab.

``clusterlab.devices.setup(8)`` runs here, at import, before any test touches JAX: the number of
simulated CPU devices is fixed once JAX has created its backends, so every test in this process
shares the same eight devices. Tests build sub-meshes over the first ``n`` of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterlab import devices

ROOT = Path(__file__).resolve().parents[1]

# The eight devices every test shares: simulated CPUs here (a GPU host with fewer than eight
# accelerators gives CPUs too, which is why tests use this list rather than jax.devices()).
DEVICES = devices.setup(8)


def sub_mesh(n: int, axis_name: str = "x"):
    """A 1-D mesh over the first ``n`` of the shared devices."""
    return devices.mesh((n,), (axis_name,), DEVICES[:n])


def run_python(*args: str, timeout: float = 120,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (fresh JAX) from the repository root."""
    return subprocess.run([sys.executable, *args], cwd=ROOT,
                          env={**os.environ, **(extra_env or {})}, capture_output=True,
                          text=True, timeout=timeout)
