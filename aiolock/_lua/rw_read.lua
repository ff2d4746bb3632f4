-- RW_READ: a reader of a read-write lock.
--
-- Keys share the name's hash tag: W the writer's lock key, I the writer's intent (a
-- waiting writer keeps new readers out: writers are not starved), R the set of reader
-- ids, R .. id each reader's own lock key, F the fencing counter. Both acquire scripts
-- reply like acquire.lua: fence or {0, pttl to wait}, with the same fencing lines
-- (ARGV[1..4] as for acquire.lua).
--
-- KEYS[1] this reader's key, KEYS[2] F, KEYS[3] W, KEYS[4] I, KEYS[5] R
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] counter retention ms, ARGV[4] fence floor,
-- ARGV[5] this reader's id (KEYS[1] is R's prefix .. id)
-- returns fence when the reader is in; {0, pttl} of the writer, its intent or this
--         reader's key (held with another token) to wait for

if redis.call('exists', KEYS[3]) == 1 then
    return {0, redis.call('pttl', KEYS[3])}
end
if redis.call('exists', KEYS[4]) == 1 then
    return {0, redis.call('pttl', KEYS[4])}
end
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {0, redis.call('pttl', KEYS[1])}
end
redis.call('sadd', KEYS[5], ARGV[5])
--+ _fence.lua
return fence
