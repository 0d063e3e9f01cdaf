--! Token bucket (GCRA), one check: admits `cost`, or takes up to `want` tokens (a lease).
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/token_bucket.rs).
--
-- KEYS[1] "<tat>": when the bucket is full again
-- ARGV    interval_us, horizon_us (capacity x interval), cost, [want: a lease, > cost]
-- Reply   granted (0 when denied), the wait until the bucket's tat (0 when it is past)
local iv, horizon, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want = tonumber(ARGV[4]) or cost
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local wait = tat - now
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
return {g, wait}
