"""Waiting for a lock: local queues, pub/sub wake-ups, turns across processes, grants, handoffs."""
