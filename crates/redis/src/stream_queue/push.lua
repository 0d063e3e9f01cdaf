-- Adds one message to a queue, unless the queue is full.
--
-- KEYS[1]  the queue's stream      KEYS[2]  the message's status hash
-- ARGV[1]  the most messages the stream may hold (delivered ones are deleted from it, so its
--          length is the queue's depth, messages being delivered included)
-- ARGV[2]  the message's id   ARGV[3] its bucket key   ARGV[4] its payload
-- ARGV[5]  when it was queued (ms since the epoch)      ARGV[6] the consumer group
--
-- Returns the stream entry's id, or false when the queue is full. One script, so the depth
-- check and the append are one step however many instances push at once.
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return false
end
-- The group starts at the stream's beginning: it must exist before the first entry, or the
-- drainers' group would be created after it and skip it.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[6], '0', 'MKSTREAM')
end
local entry = redis.call('XADD', KEYS[1], '*', 'id', ARGV[2], 'key', ARGV[3], 'p', ARGV[4],
  'at', ARGV[5])
redis.call('HSET', KEYS[2], 'state', 'queued', 'attempts', 0, 'at', ARGV[5], 'updated', ARGV[5])
return entry
