"""Published measurements the models are checked against (see :mod:`.nccl_tests`)."""
