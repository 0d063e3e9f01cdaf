-- Deletes a dead letter for good, and its status.
--
-- KEYS[1]  the dead-letter stream   KEYS[2]  the status hash
--
-- Returns 1, or 0 when the message is not a dead letter.
local dead = redis.call('HGET', KEYS[2], 'dead')
if not dead then
  return 0
end
redis.call('XDEL', KEYS[1], dead)
redis.call('DEL', KEYS[2])
return 1
