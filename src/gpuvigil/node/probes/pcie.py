"""Probe: pcie (filled in by the layer-1 work)."""
