"""The course's machinery: what labs call, grading, student copies, figures, the command line.

* :mod:`~clusterlab.course.check` - exercise answers (:mod:`~clusterlab.course.answers`) and a
  lab's own verifications (:mod:`~clusterlab.course.verification`).
* :mod:`~clusterlab.course.grading`, :mod:`~clusterlab.course.sandbox`,
  :mod:`~clusterlab.course.submission`, :mod:`~clusterlab.course.student` - keys and grading in a
  sandbox; student copies.
* :mod:`~clusterlab.course.plotting` - one look for every figure.
* :mod:`~clusterlab.course.expect` and :mod:`~clusterlab.course.cli` (``python -m clusterlab``) -
  judging nccl-tests results; the command line.
* :mod:`~clusterlab.course.examples` - programs run in several processes.

Needs the ``course`` extra for grading and student copies; ``expect`` and the ``plan`` and
``expect`` commands work on the base install.
"""
