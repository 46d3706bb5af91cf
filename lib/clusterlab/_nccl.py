"""Compatibility name: the NCCL port moved to :mod:`clusterlab.costmodel._nccl`.

Chapter 04 and ``tests/test_fabric.py`` import ``clusterlab._nccl`` (its constants and
``graphs``); this makes that name the very same module object, so nothing is copied.
"""

import sys

from clusterlab.costmodel import _nccl

sys.modules[__name__] = _nccl
