"""node/catalog"""
