"""gpuvigil: keeps GPU fleets fit for weeks-long gang training and always-on inference.

Four layers, each a package: ``node`` (layer 1, node health), ``platform`` (layer 2,
remediation), ``training`` (layer 3, resilient training), ``observe`` (layer 4, metrics,
SLOs, attribution), plus ``sim`` (the fleet simulator) and ``core`` (shared types).
"""

__version__ = "0.1.0"
