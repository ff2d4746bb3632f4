-- EXTEND_MANY: a renewal batch, many locks of one node in one call.
--
-- KEYS[i] lock keys, one per lock being renewed
-- ARGV[2i-1] token of KEYS[i]; ARGV[2i] its new time to live in milliseconds
-- returns an array: 1 at i when KEYS[i] held its token and was extended, else 0.
-- One call renews every lock of a batch: one command per node per renewal tick.
-- GET goes through pcall so that a key of another type fails only its own entry.

local out = {}
for i = 1, #KEYS do
    if redis.pcall('get', KEYS[i]) == ARGV[2 * i - 1] then
        out[i] = redis.call('pexpire', KEYS[i], ARGV[2 * i])
    else
        out[i] = 0
    end
end
return out
