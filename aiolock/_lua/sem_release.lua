-- SEM_RELEASE: the release of a semaphore's slot.
--
-- Each slot is a lock key, S .. i; the index N notes, for each slot a holder took, when
-- its key expires (ms, server time). The index is advice, never safety: a slot is taken
-- only by SET NX on its own key, and what the index says of a slot is corrected whenever
-- that slot's key is looked at. Renewal does not update it: a renewed slot's note runs
-- out while its key lives on; such a note is "to check", and the caller sends those
-- slots' keys along on its next try (see _handles/semaphore.py).
--
-- KEYS[1] the slot's key, KEYS[2] N
-- ARGV[1] token, ARGV[2] the slot's number, ARGV[3] (optional) the message, as RELEASE's
-- returns 1 when the key held the token and was deleted, else 0; the note goes with the
-- key (and with a key that expired). Announced on N's channel: one for every slot.

local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
    redis.call('del', KEYS[1])
    redis.call('zrem', KEYS[2], ARGV[2])
    redis.call('publish', KEYS[2] .. ':released', ARGV[3] or '')
    return 1
end
if not holder then
    redis.call('zrem', KEYS[2], ARGV[2])
end
return 0
