--! Concurrency, one check: takes (or renews) the request's permit while the key holds fewer
--! than its limit of others.
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/concurrency.rs); this script only
-- decides what to write, atomically.
--
-- KEYS[1] a sorted set: one member per permit held, the permit's id (16 hex digits), scored by
--         the µs it expires at
-- ARGV    lease_ttl_us, limit, the permit's id (a string: a Lua number cannot hold a 64-bit
--         id, so it is never converted), [cost: 1 when absent]
-- Reply   admitted (0/1), others (live permits but this one), own expiry - now (0: not held),
--         the earliest other permit's expiry - now (0: none)
local k, id = KEYS[1], ARGV[3]
local ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost = tonumber(ARGV[4]) or 1
-- A permit expiring at e is live while now < e: taken back at now >= e, and no sooner.
redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%d', now))
local count = redis.call('ZCARD', k)
local own = redis.call('ZSCORE', k, id)
local others = count
if own then
  own = tonumber(own) - now
  others = count - 1
else
  own = 0
end
local first = 0
if others > 0 then
  -- The earliest permit, or the next one when the earliest is this request's own.
  local two = redis.call('ZRANGE', k, 0, 1, 'WITHSCORES')
  if two[1] == id then first = tonumber(two[4]) else first = tonumber(two[2]) end
  first = first - now
end
local admitted = 0
if cost > 0 and others + cost <= limit then
  local expires = now + ttl
  redis.call('ZADD', k, string.format('%d', expires), id)
  -- The key lives as long as its newest permit, and no longer.
  local newest = tonumber(redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2])
  if newest < expires then newest = expires end
  redis.call('PEXPIRE', k, math.ceil((newest - now) / 1000))
  admitted = 1
end
return {admitted, others, own, first}
