-- SEM_ACQUIRE: take one slot of a semaphore.
--
-- Each slot is a lock key, S .. i; the index N notes, for each slot a holder took, when
-- its key expires (ms, server time). The index is advice, never safety: a slot is taken
-- only by SET NX on its own key, and what the index says of a slot is corrected whenever
-- that slot's key is looked at. Renewal does not update it: a renewed slot's note runs
-- out while its key lives on; such a note is "to check", and the caller sends those
-- slots' keys along on its next try (see _handles/semaphore.py).
--
-- KEYS[1] the slot tried (S .. c), KEYS[2] its fencing counter, KEYS[3] N,
-- KEYS[4..] slots whose note has run out, sent to be checked
-- ARGV[1..4] as for ACQUIRE, ARGV[5] c, ARGV[6] the limit, ARGV[7..] the slot numbers of
-- KEYS[4..], in the same order
-- (A node that notes ``limit`` slots reports none free without looking further: callers
-- that give one name different limits may see it full while a low slot is free.)
-- returns fence (as acquire.lua) when slot c was taken on this node; else
--         {0, ms until the first noted expiry, holder's first 8 bytes, f, f slots
--         with no note (the first from c + 1 on, at most SEM_FREE_REPORTED),
--         then slots whose note has run out (at most SEM_CHECKS)}

--+ _now_ms.lua
for i = 4, #KEYS do
    local left = redis.call('pttl', KEYS[i])
    if left == -2 then
        redis.call('zrem', KEYS[3], ARGV[i + 3])
    else
        if left < 0 then left = tonumber(ARGV[2]) end
        redis.call('zadd', KEYS[3], string.format('%.0f', now + left), ARGV[i + 3])
    end
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('zadd', KEYS[3], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[5])
    redis.call('pexpire', KEYS[3], ARGV[3])
--+ _fence.lua
return fence
end
--+ _holder.lua
local left = redis.call('pttl', KEYS[1])
if left < 0 then left = tonumber(ARGV[2]) end
redis.call('zadd', KEYS[3], string.format('%.0f', now + left), ARGV[5])
-- (N may have been written anew above, once expired or lost: never without a ttl.)
redis.call('pexpire', KEYS[3], ARGV[3])
local limit = tonumber(ARGV[6])
local c = tonumber(ARGV[5])
local free = {}
if redis.call('zcard', KEYS[3]) < limit then
    local noted = {}
    for _, i in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
        noted[tonumber(i)] = true
    end
    for j = 1, limit - 1 do
        local i = (c + j) % limit
        if not noted[i] then
            free[#free + 1] = i
            if #free == 4 then break end
        end
    end
end
local first = redis.call('zrangebyscore', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local wait = left
if first[2] then wait = math.min(wait, tonumber(first[2]) - now) end
local reply = {0, wait, string.sub(holder, 1, 8), #free}
for _, i in ipairs(free) do reply[#reply + 1] = i end
local due = redis.call('zrangebyscore', KEYS[3], '-inf', now, 'LIMIT', 0, 16)
for _, i in ipairs(due) do reply[#reply + 1] = tonumber(i) end
return reply
