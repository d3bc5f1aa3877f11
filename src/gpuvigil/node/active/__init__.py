"""node/active"""
