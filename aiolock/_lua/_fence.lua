-- The fencing lines of every script that hands out a lock: the next fencing token into
-- ``fence``. KEYS[2] is the name's counter, ARGV[3] how long it is kept (ms), ARGV[4] the
-- acquirer's floor (its clock in microseconds; why tokens increase:
-- docs/explanation/safety.md).
-- The usual case costs one command: the counter is set to the floor, and only when its
-- old value was not below the floor (clocks disagree) is it set again, to old + 1.
-- (Script calls are atomic: the floor in between is never seen.) SET ... GET needs
-- Redis 6.2 or any Valkey.

local fence = tonumber(ARGV[4])
local last = tonumber(redis.call('set', KEYS[2], ARGV[4], 'PX', ARGV[3], 'GET'))
if last and last >= fence then
    fence = last + 1
    redis.call('set', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
end
