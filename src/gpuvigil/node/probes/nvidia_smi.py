"""Probe: nvidia_smi (filled in by the layer-1 work)."""
