--! Gives permits back: removes each check's permit from its key's sorted set.
-- Runs after a clock prelude that defines `now` (µs).
--
-- KEYS[i]  the sorted set of check i (several checks may name one key)
-- ARGV[i]  its permit's id (16 hex digits)
-- Reply    how many of the permits were still held: an expired permit is dropped first and
--          counts 0, as does one never taken or already given back
local held = 0
for i = 1, #KEYS do
  local k = KEYS[i]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%d', now))
  held = held + redis.call('ZREM', k, ARGV[i])
  -- Tidy: a key with no permit left goes; one with some lives as long as its newest.
  local newest = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  if newest[2] then
    redis.call('PEXPIRE', k, math.ceil((tonumber(newest[2]) - now) / 1000))
  else
    redis.call('DEL', k)
  end
end
return held
