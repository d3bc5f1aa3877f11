"""node/sinks"""
