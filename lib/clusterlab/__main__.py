"""``python -m clusterlab``: the command line (:mod:`clusterlab.course.cli`)."""

import sys

from clusterlab.course.cli import main

sys.exit(main())
