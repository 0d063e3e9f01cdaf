-- Puts a dead letter back in its queue, as a new message with the same id (so the upstream's
-- idempotency key stays the same) and a fresh count of attempts.
--
-- KEYS[1]  the queue's stream   KEYS[2]  the dead-letter stream   KEYS[3]  the status hash
-- ARGV[1]  the group   ARGV[2]  now (ms since the epoch)
-- ARGV[3]  the most messages the queue may hold (a re-drive respects it too)
--
-- Returns the new entry's id, 0 when the queue is full, or false when the message is not a
-- dead letter.
local dead = redis.call('HGET', KEYS[3], 'dead')
if not dead then
  return false
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
local e = redis.call('XRANGE', KEYS[2], dead, dead)
if #e == 0 then
  return false
end
local f = e[1][2]
local fields = {}
for i = 1, #f, 2 do
  fields[f[i]] = f[i + 1]
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
end
local entry = redis.call('XADD', KEYS[1], '*', 'id', fields['id'], 'key', fields['key'],
  'p', fields['p'], 'at', fields['at'])
redis.call('XDEL', KEYS[2], dead)
redis.call('HDEL', KEYS[3], 'dead', 'status', 'error')
redis.call('HSET', KEYS[3], 'state', 'queued', 'attempts', 0, 'updated', ARGV[2])
return entry
