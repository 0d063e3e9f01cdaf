--! Sliding window log, one check, in a sorted set: O((1 + cost) log n) per request.
-- Runs after a clock prelude that defines `now` (µs). The caller computes the verdict from the
-- reply with the pure algorithm (crates/core/src/algorithm/sliding_log.rs).
--
-- One member per admitted unit, scored by the time it was admitted: the cost in the window is
-- ZCARD after pruning, and the k-th oldest unit (when a denial says how long to wait) is one
-- ZRANGE by rank. Members are "<score>:<index>", the index zero-padded so that at one score the
-- members are 1..m in both numeric and lexicographic order: adds append m+1.., removals take
-- the top, so an index is never reused while its member lives. A charge far past the limit
-- (multi.lua) keeps at most limit + 1 members at its score, the top one named
-- "<score>:<index>+<more>" for the units past them: while they live the log admits nothing.
--
-- KEYS[1] the sorted set
-- ARGV    window_us, limit, [cost: 1 when absent], [want: a lease, > cost; at: the score
--         offset of its units: a lease logs them at now + its ttl, the latest they can be
--         spent]
-- Reply   a plain check admitted with cost >= 1: one integer, total (before): the algorithm's
--         verdict for it needs nothing else, and an integer reply costs Redis and the client far
--         less than an array; otherwise granted (0 when denied), total, newest - now (-now for
--         none); then when denied with cost <= limit: the score of the oldest unit whose expiry
--         makes room, less now; when it takes a lease (want > cost): now
local k = KEYS[1]
local w, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) or 1
local want, at = tonumber(ARGV[4]) or cost, tonumber(ARGV[5]) or 0
-- A unit admitted at t counts while now < t + window.
redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%d', now - w))
local total = redis.call('ZCARD', k)
-- Redis 7 and later: PEXPIRE ... GT keeps a later expiry (a lease's units logged ahead), so
-- a plain admission needs neither the newest unit nor the count at its own instant.
local v7 = redis.REDIS_VERSION_NUM and cost > 0 and want == cost and at == 0
  and total + cost <= limit
if v7 then
  local ss = string.format('%d', now)
  local expire = math.ceil(w / 1000)
  if cost == 1 and redis.call('ZADD', k, 'NX', ss, ss .. ':0000000001') == 1 then
    -- added
  else
    local first = redis.call('ZCOUNT', k, ss, ss)
    for i = 1, cost do
      redis.call('ZADD', k, ss, string.format('%s:%010d', ss, first + i))
    end
  end
  if total == 0 then
    redis.call('PEXPIRE', k, expire)
  else
    redis.call('PEXPIRE', k, expire, 'GT')
  end
  return total
end
local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
local newest = 0
if top[2] then newest = tonumber(top[2]) end
if cost > limit - total then
  local free = total + cost - limit
  if free <= total then
    local r = redis.call('ZRANGE', k, free - 1, free - 1, 'WITHSCORES')
    return {0, total, newest - now, tonumber(r[2]) - now}
  end
  return {0, total, newest - now}
end
local g = limit - total
if want < g then g = want end
if g > 0 then
  local s = now + at
  local ss = string.format('%d', s)
  local first = 0
  if newest == s then
    first = tonumber(string.match(top[1], '^%d+:(%d+)'))
  elseif newest > s then
    first = redis.call('ZCOUNT', k, ss, ss)
  end
  if g == 1 then
    redis.call('ZADD', k, ss, string.format('%s:%010d', ss, first + 1))
  else
    local args = {}
    for i = 1, g do
      args[#args + 1] = ss
      args[#args + 1] = string.format('%s:%010d', ss, first + i)
      if #args == 1000 or i == g then
        redis.call('ZADD', k, unpack(args))
        args = {}
      end
    end
  end
  local last = newest
  if s > last then last = s end
  redis.call('PEXPIRE', k, math.ceil((last + w - now) / 1000))
end
if want > cost then return {g, total, newest - now, now} end
if g > 0 then return total end
return {g, total, newest - now}
