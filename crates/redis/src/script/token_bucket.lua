--! Token bucket (GCRA), one check: admits `cost`, or takes up to `want` tokens (a lease).
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/token_bucket.rs).
--
-- KEYS[1] "<tat>": when the bucket is full again
-- ARGV    interval_us, horizon_us (capacity x interval), [cost: 1 when absent],
--         [want: a lease, > cost]
-- Reply   a plain check: one integer, the wait until the bucket's tat (0 when it is past), or
--         -1 minus it when denied; a lease: granted (0 when denied), that wait. A tat past
--         2^53 (a charge far past the limit) is denied whatever the cost, and replies 0 and the
--         wait as a decimal string, exact.
local iv, horizon = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) or 1
local want = tonumber(ARGV[4])
local v = redis.call('GET', KEYS[1])
local tat = tonumber(v or 0)
if tat >= 9007199254740992 then
  -- Past 2^53 µs (a charge far past the limit put it there): nothing fits, and the wait is
  -- exact only as a string.
  --[[big_time]]
  local h, l = split(v)
  local nh, nl = split(now)
  return {0, join(h - nh, l - nl)}
end
if tat < now then tat = now end
local wait = tat - now
-- Whole tokens in the bucket: admitted iff tat + cost x interval - now <= horizon.
local room = math.floor((now + horizon - tat) / iv)
local g = 0
if cost <= room then
  g = want or cost
  if room < g then g = room end
  if g > 0 then
    tat = tat + g * iv
    redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
  end
end
if want then return {g, wait} end
if cost <= room then return wait end
return -1 - wait
