"""The judged data that evaluation and training both read, and the fixed splits between them.

Read in data-flow order: ``queries`` (``EvalQuery``: a query, its candidates
and their grades), the constructions that build such lists from the public
data sets, ``qmsum``, ``farrelevant`` and ``squad``, the ``splits`` that say
which topics and meetings are reported and which may train, ``judged``
(``JudgedQuery``, the training unit, and the readers of a user's TREC files)
and ``runs`` (what a system answered per query, and its ir-measures).

``keyrank.evaluation`` and ``keyrank.training`` import this package and never
each other; it imports neither, so the splits one reports on and the other
keeps off are one definition.
"""
