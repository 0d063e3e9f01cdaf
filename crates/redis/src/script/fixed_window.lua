--! Fixed window, one check: admits `cost`, or takes up to `want` (a lease) when `cost` fits.
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/fixed_window.rs); this script only
-- decides what to write, atomically.
--
-- KEYS[1] "<window_end> <count>"
-- ARGV    window_us, limit, cost, [want: a lease, > cost]
-- Reply   granted (0 when denied; cost..want when admitted), window_end - now, count (before);
--         and now when it takes a lease (want > cost)
local w, limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want = tonumber(ARGV[4]) or cost
-- Exact: floor(a / b) of doubles is exact for integers a < 2^53.
local e = now - now % w + w
local c = 0
local v = redis.call('GET', KEYS[1])
if v then
  local se, sc = string.match(v, '^(%d+) (%d+)$')
  se = tonumber(se)
  -- A later end means the clock stepped back: keep counting in that window.
  if se >= e then e, c = se, tonumber(sc) end
end
local g = 0
if c + cost <= limit then
  g = limit - c
  if want < g then g = want end
  if g > 0 then
    redis.call('SET', KEYS[1], string.format('%d %d', e, c + g), 'PX', math.ceil((e - now) / 1000))
  end
end
if want > cost then return {g, e - now, c, now} end
return {g, e - now, c}
