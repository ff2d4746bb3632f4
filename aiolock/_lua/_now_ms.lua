-- The server's clock in ms, into ``now`` (TIME: the same clock as the keys' expiry).

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
