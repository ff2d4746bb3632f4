-- The lines that read a held lock's token into ``holder``, or reply WRONGTYPE when the
-- key exists but is not a lock (a name collision).

local holder = redis.pcall('get', KEYS[1])
if type(holder) ~= 'string' then
    local kind = redis.call('type', KEYS[1])['ok']
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
