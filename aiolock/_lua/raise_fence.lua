-- RAISE_FENCE: bring a name's fencing counter up to a token handed out.
--
-- KEYS[1] fencing counter
-- ARGV[1] a fencing token handed out (or about to be)
-- ARGV[2] how long the counter is kept after its last use, in milliseconds
-- returns 1: the counter is now at least ARGV[1] (raised if it was lower)

local last = tonumber(redis.call('get', KEYS[1]))
if not last or last < tonumber(ARGV[1]) then
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
