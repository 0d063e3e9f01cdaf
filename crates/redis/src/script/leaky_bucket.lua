--! Leaky bucket, one check. Runs after a clock prelude that defines `now` (µs). The caller
-- computes the verdict (and the delay) from the reply with the pure algorithm
-- (crates/core/src/algorithm/leaky_bucket.rs).
--
-- KEYS[1] "<next_free>": when the next departure slot is free
-- ARGV    interval_us, depth_us (burst x interval), cost, [max_delay_us]
-- Reply   admitted (0/1), the wait until the next free slot (0 when it is past)
local iv, depth, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local maxd = tonumber(ARGV[4]) or depth
local start = tonumber(redis.call('GET', KEYS[1]) or 0)
if start < now then start = now end
local wait = start - now
local e = start + cost * iv
if e - now <= depth and wait <= maxd then
  if cost > 0 then
    redis.call('SET', KEYS[1], string.format('%d', e), 'PX', math.ceil((e - now) / 1000))
  end
  return {1, wait}
end
return {0, wait}
