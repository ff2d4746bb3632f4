-- TURN_JOIN: a waiting process joins a name's turn queue, or refreshes its entry.
--
-- On each node a name's turn queue is three sorted sets, all with the name's hash tag:
-- <key>:turns (member -> place), <key>:turns:live (member -> when the entry expires,
-- server ms) and <key>:turns:offers (place -> the member's offer: the token and ttl its
-- head would take the lock with, as "member seq ttl retention at token", at the
-- server's ms when the offer arrived; seq ends in * when the offer is tentative, see
-- release_turn.lua).
--
-- A process waiting for a lock joins its turn queue, or refreshes its entry there, with
-- its head's offer (see RELEASE_TURN).
-- KEYS[1] the turn queue, KEYS[2] the entries' expiries, KEYS[3] the offers
-- ARGV[1] the process's member, ARGV[2] its place (the same on every node: its clock
--         in microseconds when it joined), ARGV[3] how long the entry lives unless
--         refreshed, in ms, ARGV[4..7] (optional) its offer: seq, ttl ms, retention ms,
--         token (without: its offer is taken out, as where pub/sub turned out refused)
-- returns 1. A member already in line keeps its place (a node that missed its leave
-- keeps the place it joined with before), and its offer sits there, where a release
-- looks for the offer of the process it names (an earlier one, there or at the place
-- sent, is taken out); the keys expire with the last entry, so that a name nobody
-- waits for leaves nothing behind.

--+ _now_ms.lua
local place = redis.call('zadd', KEYS[1], 'XX', 'INCR', 0, ARGV[1])
if not place then
    redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
    place = ARGV[2]
end
redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[3])
redis.call('pexpire', KEYS[2], ARGV[3])
for _, at in ipairs({place, ARGV[2]}) do
    for _, old in ipairs(redis.call('zrangebyscore', KEYS[3], at, at)) do
        if string.sub(old, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
            redis.call('zrem', KEYS[3], old)
        end
    end
end
if ARGV[7] then
redis.call('zadd', KEYS[3], place, ARGV[1] .. ' ' .. ARGV[4] .. ' '
    .. ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. string.format('%.0f', now) .. ' '
    .. ARGV[7])
redis.call('pexpire', KEYS[3], ARGV[3])
end
return 1
