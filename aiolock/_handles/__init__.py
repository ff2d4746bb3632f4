"""The public handles (Lock, Semaphore, LockMany, ReadLock/WriteLock): no Lua, no nodes."""
