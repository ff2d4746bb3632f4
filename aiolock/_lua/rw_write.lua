-- RW_WRITE: the writer of a read-write lock.
--
-- Keys share the name's hash tag: W the writer's lock key, I the writer's intent (a
-- waiting writer keeps new readers out: writers are not starved), R the set of reader
-- ids, R .. id each reader's own lock key, F the fencing counter. Both acquire scripts
-- reply like acquire.lua: fence or {0, pttl to wait}, with the same fencing lines
-- (ARGV[1..4] as for acquire.lua).
--
-- KEYS[1] W, KEYS[2] F, KEYS[3] I, KEYS[4] R, KEYS[5..] the readers' keys the caller
-- knows of (R's prefix .. id; none at first)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] counter retention ms, ARGV[4] fence floor,
-- ARGV[5] the prefix of readers' keys (R's members are appended to it),
-- ARGV[6] '1' when the writer will wait (then it leaves its intent), '0' if not
-- returns fence when the writer is in; {0, ms to wait} while W or a live reader
--         holds; {2, id, ...} when a reader's key was not declared (below).
-- Every key touched is declared: when R names a reader whose key is not among KEYS, the
-- script touches nothing and replies {2, id, ...} (R's members): the caller asks again
-- with their keys (see Quorum.acquire's keys_asked).
-- Readers whose key expired are dropped from R here. While live readers remain, a
-- waiting writer leaves its intent (until the last of them would expire, plus a
-- second); the writer that gets the lock clears it.

if redis.call('exists', KEYS[1]) == 1 then
    return {0, redis.call('pttl', KEYS[1])}
end
local declared = {}
for i = 5, #KEYS do
    declared[KEYS[i]] = i
end
local readers = redis.call('smembers', KEYS[4])
for _, id in ipairs(readers) do
    if not declared[ARGV[5] .. id] then
        local ask = {2}
        for j, member in ipairs(readers) do
            ask[j + 1] = member
        end
        return ask
    end
end
local wait = -2
for _, id in ipairs(readers) do
    local left = redis.call('pttl', KEYS[declared[ARGV[5] .. id]])
    if left == -2 then
        redis.call('srem', KEYS[4], id)
    elseif left == -1 then
        wait = math.max(wait, tonumber(ARGV[2]))
    else
        wait = math.max(wait, left)
    end
end
if wait >= 0 then
    if ARGV[6] == '1' then
        redis.call('set', KEYS[3], ARGV[1], 'PX', wait + 1000)
    end
    return {0, wait}
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('del', KEYS[3])
--+ _fence.lua
return fence
