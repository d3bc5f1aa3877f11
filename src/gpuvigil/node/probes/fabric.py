"""Probe: fabric (filled in by the layer-1 work)."""
