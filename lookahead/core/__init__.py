"""The types several phases of a step share: the token tree and the step's layout (tree.py), which
logit rows are which (rows.py), and the online learner the estimates are built on (learner.py).

A leaf of the package: it imports only ``lookahead.kernels``.
"""
