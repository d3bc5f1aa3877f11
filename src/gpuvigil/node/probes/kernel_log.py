"""Probe: kernel_log (filled in by the layer-1 work)."""
