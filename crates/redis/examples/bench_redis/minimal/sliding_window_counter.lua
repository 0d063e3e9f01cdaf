--! The least Lua that makes the sliding window counter's decision with Redis TIME (the floor
-- for sliding_counter.lua): same state, cost 1, the estimate in floating point.
-- ARGV: window_us, limit
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local w = tonumber(ARGV[1])
local e = now - now % w + w
local cur, prev = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local se, sc, sp = string.match(v, '(%d+) (%d+) (%d+)')
  se = tonumber(se)
  if se == e then cur, prev = tonumber(sc), tonumber(sp)
  elseif se + w == e then prev = tonumber(sc) end
end
if cur + 1 + prev * (e - now) / w > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], string.format('%d %d %d', e, cur + 1, prev), 'PX', math.ceil((e + w - now) / 1000))
return 1
