--! The least Lua that makes the leaky bucket's decision with Redis TIME (the floor for
-- leaky_bucket.lua): same state, cost 1, no max_delay; returns the delay.
-- ARGV: interval_us, depth_us
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local start = tonumber(redis.call('GET', KEYS[1]) or 0)
if start < now then start = now end
local e = start + tonumber(ARGV[1])
if e - now > tonumber(ARGV[2]) then return -1 end
redis.call('SET', KEYS[1], string.format('%d', e), 'PX', math.ceil((e - now) / 1000))
return start - now
