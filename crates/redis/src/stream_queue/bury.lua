-- Moves a message that ran out of attempts to the dead-letter stream, in one step: copied
-- there with why it died, acknowledged and deleted from the queue, its status "dead" (kept
-- until it is re-driven or discarded).
--
-- KEYS[1]  the queue's stream   KEYS[2]  the dead-letter stream   KEYS[3]  the status hash
-- ARGV[1]  the group   ARGV[2]  the entry id   ARGV[3]  attempts made
-- ARGV[4]  the last upstream status ("" for none)   ARGV[5]  the last error ("" for none)
-- ARGV[6]  now (ms since the epoch)
--
-- Returns the dead letter's entry id, or false when the entry was no longer in the stream.
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if #e == 0 then
  return false
end
local f = e[1][2]
local fields = {}
for i = 1, #f, 2 do
  fields[f[i]] = f[i + 1]
end
local dead = redis.call('XADD', KEYS[2], '*', 'id', fields['id'] or '', 'key', fields['key'] or '',
  'p', fields['p'] or '', 'at', fields['at'] or '0', 'attempts', ARGV[3], 'status', ARGV[4],
  'error', ARGV[5], 'died', ARGV[6])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[3], 'state', 'dead', 'attempts', ARGV[3], 'status', ARGV[4],
  'error', ARGV[5], 'updated', ARGV[6], 'dead', dead)
redis.call('PERSIST', KEYS[3])
return dead
