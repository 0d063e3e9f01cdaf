--! Sliding window counter, one check: admits `cost`, or takes up to `want` (a lease).
-- Runs after a clock prelude that defines `now` (µs); ceil_mul_div.lua is spliced in below. The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/sliding_window.rs).
--
-- KEYS[1] "<window_end> <current> <previous>"
-- ARGV    window_us, limit, [cost: 1 when absent], [want: a lease, > cost]
-- Reply   a plain check admitted with cost >= 1: one integer, (window_end - now) x (limit + 1)
--         + current + weighted previous (before): the algorithm's verdict for an admission
--         needs nothing else (an integer reply costs Redis and the client far less than an
--         array). Otherwise one integer ((window_end - now) x (limit + 1) + current) x
--         (limit + 1) + previous (before), or -1 minus that when denied. When the integer does
--         not fit in 2^53, when a count is past the limit, or for a lease: granted (0 when
--         denied), window_end - now, current, previous (before), and now for a lease
--         (want > cost)
local w, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) or 1
local want = tonumber(ARGV[4]) or cost
local e = now - now % w + w
local cur, prev = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local se, sc, sp = string.match(v, '^(%d+) (%d+) (%d+)$')
  se = tonumber(se)
  if se >= e then e, cur, prev = se, tonumber(sc), tonumber(sp)
  elseif se + w == e then prev = tonumber(sc) end
end
-- The time the previous window still covers.
local since = now - e + w
if since < 0 then since = 0 elseif since > w then since = w end
local p = prev * (w - since)
-- weighted = ceil(previous x overlap / window), exactly: admitted iff current + cost + weighted
-- <= limit (the pure algorithm's comparison, multiplied out).
local q
if p < 9007199254740992 then
  q = math.floor(p / w)
  if q * w < p then q = q + 1 end
else
  local a, b, d = prev, w - since, w
  --[[ceil_mul_div]]
end
local room = limit - cur - q
local g = 0
if cost <= room then
  g = room
  if want < g then g = want end
  if g > 0 then
    redis.call('SET', KEYS[1], string.format('%d %d %d', e, cur + g, prev), 'PX',
      math.ceil((e + w - now) / 1000))
  end
end
if want > cost then return {g, e - now, cur, prev, now} end
if cost > 0 and cost <= room then
  -- current + weighted <= limit - cost here, so it is one digit of base limit + 1.
  local packed = (e - now) * (limit + 1) + cur + q
  if packed < 9007199254740992 then return packed end
  return {g, e - now, cur, prev}
end
local packed = ((e - now) * (limit + 1) + cur) * (limit + 1) + prev
if packed >= 9007199254740992 or cur > limit or prev > limit then
  return {g, e - now, cur, prev}
end
if cost <= room then return packed end
return -1 - packed
