"""Talking to the nodes: pipelined connections, pub/sub, clusters, and the one redis-py seam."""
