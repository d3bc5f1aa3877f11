"""node/rules"""
