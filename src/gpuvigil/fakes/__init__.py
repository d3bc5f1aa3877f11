"""Fakes for what cannot exist on a CI machine (NVML, GPUs, EFA hardware).

Shared by the tests and the simulator; production code never imports them.
"""
