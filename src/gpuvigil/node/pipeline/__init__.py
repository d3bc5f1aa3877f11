"""One pipeline from reading to finding (DESIGN: pure core, thin I/O).

Probes read the world into typed readings (each domain's `node/checks/<domain>/readings.py`);
rules declare what they read (`registry.rule`); `judge` feeds every rule the readings and
facts it declared, for the live checks, the agent's kernel-log stream, `gpuvigil analyze`,
the simulator and replay alike. `Facts` holds the latest reading of each type for one node.
Modules: `facts`, `registry`, `judge` (import them directly; this package imports nothing,
so a rule module can import the registry without pulling in every rule).
"""
