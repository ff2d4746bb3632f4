-- TURN_LEAVE: a process leaves the turn queue (or is taken out of it).
--
-- On each node a name's turn queue is three sorted sets, all with the name's hash tag:
-- <key>:turns (member -> place), <key>:turns:live (member -> when the entry expires,
-- server ms) and <key>:turns:offers (place -> the member's offer: the token and ttl its
-- head would take the lock with, as "member seq ttl retention at token", at the
-- server's ms when the offer arrived; seq ends in * when the offer is tentative, see
-- release_turn.lua).
--
-- A process that waits no more leaves the turn queue, with its offer; or a process that
-- was named and did not use its turn is taken out by one that went in its place. Not
-- while the lock is held: then the process named most likely took it (and holds it
-- longer than the others' fallback), and out of line it would let the next holder's
-- handoffs find nobody else waiting (a streak run to LONE_STREAK).
-- The process taken out is told on its grant channel (``out``): alive and waiting (it
-- may have used its turn, and held the lock until it expired just before the other's
-- fallback), it joins again at its place at once, not at its
-- next refresh (see TurnEntry.taken_out).
-- KEYS[1] the turn queue, KEYS[2] the entries' expiries, KEYS[3] the offers, KEYS[4]
-- (only to take another process out) the lock
-- ARGV[1] the process's member
-- returns the number of entries removed (0 or 1).

if KEYS[4] and redis.call('exists', KEYS[4]) == 1 then
    return 0
end
for _, offer in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    if string.sub(offer, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
        redis.call('zrem', KEYS[3], offer)
    end
end
redis.call('zrem', KEYS[2], ARGV[1])
local removed = redis.call('zrem', KEYS[1], ARGV[1])
if KEYS[4] and removed == 1 then
    redis.call('publish', KEYS[4] .. ':turn:' .. ARGV[1], 'out')
end
return removed
