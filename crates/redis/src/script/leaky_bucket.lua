--! Leaky bucket, one check. Runs after a clock prelude that defines `now` (µs). The caller
-- computes the verdict (and the delay) from the reply with the pure algorithm
-- (crates/core/src/algorithm/leaky_bucket.rs).
--
-- KEYS[1] "<next_free>": when the next departure slot is free
-- ARGV    step_us (cost x interval), depth_us (burst x interval), [max_delay_us]
-- Reply   one integer: the wait until the next free slot (0 when it is past) when admitted,
--         -1 minus it when denied; for a slot past 2^53 µs (a charge far past the limit), denied
--         whatever the cost: 0 and the wait as a decimal string, exact
local step, depth = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxd = tonumber(ARGV[3]) or depth
local v = redis.call('GET', KEYS[1])
local start = tonumber(v or 0)
if start >= 9007199254740992 then
  -- Past 2^53 µs (a charge far past the limit put it there): nothing fits, and the wait is
  -- exact only as a string.
  --[[big_time]]
  local h, l = split(v)
  local nh, nl = split(now)
  return {0, join(h - nh, l - nl)}
end
if start < now then start = now end
local wait = start - now
local e = start + step
if e - now <= depth and wait <= maxd then
  if step > 0 then
    redis.call('SET', KEYS[1], string.format('%d', e), 'PX', math.ceil((e - now) / 1000))
  end
  return wait
end
return -1 - wait
