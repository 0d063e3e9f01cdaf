-- The queue's depth, its dead letters, and when its oldest message was queued.
--
-- KEYS[1]  the queue's stream   KEYS[2]  the dead-letter stream
--
-- Returns {depth, dead letters, oldest message's "at" field or false}.
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local at = false
if first[1] then
  local f = first[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'at' then
      at = f[i + 1]
    end
  end
end
return {redis.call('XLEN', KEYS[1]), redis.call('XLEN', KEYS[2]), at}
