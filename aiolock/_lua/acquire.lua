-- ACQUIRE: take the lock on one node (SET NX PX), with the next fencing token.
--
-- KEYS[1] lock key
-- KEYS[2] fencing counter of the same name
-- ARGV[1] token
-- ARGV[2] time to live in milliseconds
-- ARGV[3] how long the counter is kept after its last use, in milliseconds
-- ARGV[4] the acquirer's clock in microseconds: the floor of the fencing token
-- returns fence, a bare integer, when the key was set (the lock taken on this node):
--         max(counter + 1, ARGV[4]), also stored as the counter (see _fence.lua); the
--         same when the key already held this very token (a release granted it to this
--         attempt's process, see RELEASE_TURN: its expiry is reset to ARGV[2]). (A
--         number costs the server less to reply than a table: this is the usual reply.)
--         {0, pttl, holder} when held by someone else: the holder's remaining time to
--         live in ms (-1: no expiry), which bounds how long a waiter sleeps if the
--         release message is lost, and the first 8 bytes of the holder's token, which
--         tell a lost race from a split vote (see Quorum.acquire);
--         a WRONGTYPE error when the key exists but is not a lock (a name collision).

if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
--+ _fence.lua
return fence
end
--+ _holder.lua
if holder == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
--+ _fence.lua
    return fence
end
return {0, redis.call('pttl', KEYS[1]), string.sub(holder, 1, 8)}
