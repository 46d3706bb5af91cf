"""Published measurements the models are checked against (see :mod:`.nccl_tests`).

:mod:`.nccl_tests` holds nccl-tests (and nccl-tests-like) bus bandwidths, each row with its
source URL, its provenance (a full table, another tool, a maintainer's or a user's statement),
the fabric it crosses, the NCCL version, what the source states and what had to be inferred;
``rows_in(regime=...)`` and ``uncovered_regimes()`` say which regimes have evidence.
"""
