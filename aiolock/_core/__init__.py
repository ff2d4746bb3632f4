"""Pure logic, no I/O: votes and their arithmetic, holds, fencing, keys, errors, events."""
