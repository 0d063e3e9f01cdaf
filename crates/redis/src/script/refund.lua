--! Gives back the cost of admitted checks, or returns the unspent units of a lease.
-- Runs after a clock prelude that defines `now` (µs). Mirrors the pure algorithms' `refund`.
--
-- KEYS[i]  the state key of check i
-- ARGV[1 + 5(i-1) ..] per check: algorithm (codes as in multi.lua), p1 (window_us or
--          interval_us; minus the period's end for a calendar window), cost (for a bucket, the
--          step instead: cost x interval µs, at most 2^63 - 1), guard, 0 (concurrency: the
--          permit's id). The guard ties a
--          lease's return to where its units were taken: the window end (fixed window, sliding
--          window counter: nothing comes back once that window is over) or the score they were
--          logged at (sliding window log); 0 for a plain refund. A concurrency refund gives the
--          permit back, as release.lua does.
-- A log's units come back newest first (only at the guard's score, for a lease's): at each
-- score, first the units its top member's name counts besides itself ("<score>:<index>+<more>",
-- a charge far past the limit: see multi.lua), then its members from the top. The work is one
-- step per score emptied, at most the key's members, whatever the cost.
for i = 1, #KEYS do
  local b = (i - 1) * 5
  local alg, p1, cost, guard = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local key = KEYS[i]
  if alg == 6 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
    redis.call('ZREM', key, ARGV[b + 5])
    if redis.call('ZCARD', key) == 0 then redis.call('DEL', key) end
  elseif alg == 2 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - p1))
    local left = cost
    local hi, lo = '+inf', '-inf'
    if guard > 0 then
      hi = string.format('%d', guard)
      lo = hi
    end
    while left > 0 do
      local top = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, 1)
      if not top[1] then break end
      local name = top[1]
      local ss, first = string.match(name, '^(%d+):(%d+)')
      first = tonumber(first)
      local more = tonumber(string.match(name, '%+(%d+)$') or '0')
      if more >= left then
        -- Only units its name counts: it stays, counting fewer.
        redis.call('ZREM', key, name)
        if more > left then
          name = string.format('%s:%010d+%d', ss, first, more - left)
        else
          name = string.format('%s:%010d', ss, first)
        end
        redis.call('ZADD', key, top[2], name)
        break
      end
      left = left - more
      -- The members at this score are 1..first, the highest ranks below `rank` (0 for a plain
      -- refund: this score is the newest).
      local rank = 0
      if guard > 0 then rank = redis.call('ZREVRANK', key, name) end
      local k = first
      if left < k then k = left end
      redis.call('ZREMRANGEBYRANK', key, -(rank + k), -(rank + 1))
      left = left - k
      if guard > 0 then break end
    end
  else
    local v = redis.call('GET', key)
    if v then
      if alg == 1 or alg == 3 then
        local e
        if p1 < 0 then e = -p1 else e = now - now % p1 + p1 end
        local se, sc, sp = string.match(v, '^(%d+) (%d+) ?(%d*)$')
        se = tonumber(se)
        local cur, prev = 0, 0
        if se >= e then e, cur, prev = se, tonumber(sc), tonumber(sp) or 0
        elseif alg == 3 and se + p1 == e then prev = tonumber(sc) end
        if guard == 0 or guard == e then
          cur = cur - cost
          if cur < 0 then cur = 0 end
        end
        local until_us
        if alg == 1 then
          until_us = e
        elseif cur > 0 then
          until_us = e + p1
        elseif prev > 0 then
          until_us = e
        else
          until_us = 0
        end
        if until_us <= now then
          redis.call('DEL', key)
        elseif alg == 1 then
          redis.call('SET', key, string.format('%d %d', e, cur), 'PX', math.ceil((until_us - now) / 1000))
        else
          redis.call('SET', key, string.format('%d %d %d', e, cur, prev), 'PX',
            math.ceil((until_us - now) / 1000))
        end
      else
        -- Both buckets: `cost` is the step (cost x interval).
        local t = tonumber(v)
        local back
        if t >= 9007199254740992 then
          -- A time past 2^53 (a charge far past the limit), exact as its string only: later
          -- than now, so both buckets come back to now at most.
          --[[big_time]]
          local step = cost
          if cost >= 9007199254740992 then step = ARGV[b + 3] end
          local h, l = split(v)
          local sh, sl = split(step)
          back = join(h - sh, l - sl)
          if type(back) == 'number' and back < now then back = now end
        else
          back = t - cost
          if alg == 4 then
            local floor_at = now
            if t < floor_at then floor_at = t end
            if back < floor_at then back = floor_at end
          elseif t > now then
            if back < now then back = now end
          else
            back = t
          end
        end
        if type(back) == 'string' then
          redis.call('SET', key, back, 'PX',
            string.format('%d', math.ceil((tonumber(back) - now) / 1000) + 2))
        elseif back <= now then
          redis.call('DEL', key)
        else
          redis.call('SET', key, string.format('%d', back), 'PX', math.ceil((back - now) / 1000))
        end
      end
    end
  end
end
return 1
