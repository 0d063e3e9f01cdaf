--! Token bucket (GCRA), one check: admits `cost`, or takes up to `want` tokens (a lease).
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/token_bucket.rs).
--
-- KEYS[1] "<tat>": when the bucket is full again
-- ARGV    now, interval_us, horizon_us (capacity x interval), cost, want (>= cost)
-- Reply   now, granted (0 when denied), tat (as stored, 0 for none)
local iv, horizon, cost, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local stored = tonumber(redis.call('GET', KEYS[1]) or 0)
local tat = stored
if tat < now then tat = now end
-- Whole tokens in the bucket: admitted iff tat + cost x interval - now <= horizon.
local room = math.floor((now + horizon - tat) / iv)
local g = 0
if cost <= room then
  g = room
  if want < g then g = want end
  if g > 0 then
    tat = tat + g * iv
    redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
  end
end
return {now, g, stored}
