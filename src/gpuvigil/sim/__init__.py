"""The fleet simulator (`gpuvigil simulate`, `demo`, `replay`; docs/simulator.md).

Only the CLI and tests import it. Read in this order: `faults` (the fault model and its
published rates), `engine` + `lifecycle` (the event heap, nodes and jobs), `hardware` +
`detect` (layer 1: the real rules over fakes), `platform` + `episodes` (layer 2: the real
controller on the in-memory cluster), `restart` (layer 3), `record` (layer 4), `run`.
"""
