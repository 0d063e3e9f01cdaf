--! The least Lua that makes the token bucket's (GCRA) decision with Redis TIME (the floor for
-- token_bucket.lua): same state, cost 1.
-- ARGV: interval_us, horizon_us
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1])
if tat - now > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
return 1
