--! Fixed window, one check: admits `cost`, or takes up to `want` (a lease) when `cost` fits.
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/fixed_window.rs); this script only
-- decides what to write, atomically.
--
-- KEYS[1] "<window_end> <count>"
-- ARGV    window_us, limit, [cost: 1 when absent], [want: a lease, > cost]
--         or, for a calendar window (a day, a month… whose length varies; the caller computes
--         the periods): -period_end_us, limit, cost, want (0: none), next_period_end_us
-- Reply   a plain check: one integer, (window_end - now) x (limit + 1) + count (before), or
--         -1 minus that when denied (an integer reply costs Redis far less than an array);
--         when it does not fit in 2^53, when the count is past the limit, or for a lease: granted (0 when denied; cost..want
--         when admitted), window_end - now, count (before), and now for a lease
local w, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) or 1
local want = tonumber(ARGV[4])
local e
if w < 0 then
  -- The caller's period; the next one when this clock has passed its end.
  e = -w
  if now >= e then e = tonumber(ARGV[5]) end
  if e <= now then return redis.error_reply('the calendar period given ends before now') end
  if want == 0 then want = nil end
else
  -- Exact: floor(a / b) of doubles is exact for integers a < 2^53.
  e = now - now % w + w
end
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
  g = want or cost
  if c + g > limit then g = limit - c end
  if g > 0 then
    redis.call('SET', KEYS[1], string.format('%d %d', e, c + g), 'PX', math.ceil((e - now) / 1000))
  end
end
if want then return {g, e - now, c, now} end
local packed = (e - now) * (limit + 1) + c
if packed >= 9007199254740992 or c > limit then return {g, e - now, c} end
if c + cost <= limit then return packed end
return -1 - packed
