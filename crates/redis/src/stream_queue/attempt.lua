-- Counts one delivery attempt of a message, before it is made.
--
-- KEYS[1]  the message's status hash        ARGV[1]  now (ms since the epoch)
--
-- Returns the attempt's number (1 for the first). Kept in Redis, so an instance that claims
-- the message from a stopped one goes on counting from where that one was.
local n = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'state', 'delivering', 'updated', ARGV[1])
return n
