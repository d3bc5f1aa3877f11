"""platform/clusters"""
