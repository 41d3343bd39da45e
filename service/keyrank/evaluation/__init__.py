"""Offline quality evaluation: judged data sets -> EvalQuery lists -> Reranker runs -> report.

Read in data-flow order: ``queries`` (the shape), the constructions
``qmsum``, ``farrelevant``, ``squad`` (chosen by name in ``tasks``), then
``runner`` (through ``Reranker.arank``), ``report`` (ir-measures, PSI, cost,
evidence) and ``plots``; ``cli`` ties them together as ``keyrank eval``.
"""
