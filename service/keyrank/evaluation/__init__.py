"""Offline quality evaluation: judged data sets -> EvalQuery lists -> Reranker runs -> report.

Read in data-flow order: ``tasks`` (which of ``keyrank.data``'s constructions
builds which query list), then ``runner`` (through ``Reranker.arank``),
``report`` (ir-measures, PSI, cost, evidence) and ``plots``; ``cli`` ties them
together as ``keyrank eval``. The judged data itself (the ``EvalQuery`` shape,
the QMSum, far-relevant and SQuAD constructions, the fixed splits) is
``keyrank.data``, which training reads too.
"""
