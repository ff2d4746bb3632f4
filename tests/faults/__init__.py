"""Fault injection for the tests: a TCP proxy per node, and server process faults."""

from .proxy import Mode, Proxy, proxies, tls_proxies

__all__ = ["Mode", "Proxy", "proxies", "tls_proxies"]
