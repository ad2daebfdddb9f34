"""The small core every other layer of edgekit may use: one place for each rule.

Modules here import nothing else from edgekit (and nothing heavy): file writing and hashing
(``io``), where edgekit keeps things (``paths``), percentiles and agreement (``stats``).
"""
