--! The least Lua that makes the sliding window log's decision with Redis TIME (the floor for
-- sliding_log.lua): the usual sorted-set log, cost 1, one member per request.
-- ARGV: window_us, limit
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local w = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - w))
local n = redis.call('ZCARD', KEYS[1])
if n + 1 > tonumber(ARGV[2]) then return 0 end
local s = string.format('%d', now)
redis.call('ZADD', KEYS[1], s, s .. ':' .. n)
redis.call('PEXPIRE', KEYS[1], math.ceil(w / 1000))
return 1
