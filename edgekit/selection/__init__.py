"""Which candidate runs here: the plan (a pure ranking, then loading with fallback), the
measured order, the candidate <-> artifact rule, precision on this CPU, and ``edgekit doctor``.
"""
