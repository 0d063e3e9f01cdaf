--! The least Lua that makes the fixed window's decision with Redis TIME: the floor the store's
-- fixed_window.lua is measured against (scripts/bench-redis.sh). Same state and admission,
-- cost 1, and nothing else: no lease, no reply but allowed.
-- ARGV: window_us, limit
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local w = tonumber(ARGV[1])
local e = now - now % w + w
local c = 0
local v = redis.call('GET', KEYS[1])
if v then
  local se, sc = string.match(v, '(%d+) (%d+)')
  if tonumber(se) == e then c = tonumber(sc) end
end
if c + 1 > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], string.format('%d %d', e, c + 1), 'PX', math.ceil((e - now) / 1000))
return 1
