"""The fan-out to every node, and the renewal of held locks."""
