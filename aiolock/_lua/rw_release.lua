-- RW_RELEASE: the release of a read-write lock's reader or writer.
--
-- Keys share the name's hash tag: W the writer's lock key, I the writer's intent (a
-- waiting writer keeps new readers out: writers are not starved), R the set of reader
-- ids, R .. id each reader's own lock key, F the fencing counter. Both acquire scripts
-- reply like acquire.lua: fence or {0, pttl to wait}, with the same fencing lines
-- (ARGV[1..4] as for acquire.lua).
--
-- KEYS[1] the handle's key (W, or a reader's), KEYS[2] R
-- ARGV[1] token, ARGV[2] reader id ('' for the writer), ARGV[3] channel to publish on
-- returns 1 when released, else 0

if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    if ARGV[2] ~= '' then
        redis.call('srem', KEYS[2], ARGV[2])
    end
    redis.call('publish', ARGV[3], '')
    return 1
end
return 0
