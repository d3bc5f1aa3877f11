"""node/probes"""
