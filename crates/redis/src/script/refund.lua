--! Gives back the cost of admitted checks, or returns the unspent units of a lease.
-- Runs after a clock prelude that defines `now` (µs). Mirrors the pure algorithms' `refund`.
--
-- KEYS[i]  the state key of check i
-- ARGV[1 + 5(i-1) ..] per check: algorithm (codes as in multi.lua), p1 (window_us or
--          interval_us; minus the period's end for a calendar window), cost, guard, 0 (concurrency: the permit's id). The guard ties a
--          lease's return to where its units were taken: the window end (fixed window, sliding
--          window counter: nothing comes back once that window is over) or the score they were
--          logged at (sliding window log); 0 for a plain refund. A concurrency refund gives the
--          permit back, as release.lua does.
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
    if cost > 0 then
      if guard > 0 then
        local gs = string.format('%d', guard)
        local units = redis.call('ZREVRANGEBYSCORE', key, gs, gs, 'LIMIT', 0, cost)
        if #units > 0 then redis.call('ZREM', key, unpack(units)) end
      else
        redis.call('ZREMRANGEBYRANK', key, -cost, -1)
      end
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
        local t = tonumber(v)
        local back = t - cost * p1
        if alg == 4 then
          local floor_at = now
          if t < floor_at then floor_at = t end
          if back < floor_at then back = floor_at end
        elseif t > now then
          if back < now then back = now end
        else
          back = t
        end
        if back <= now then
          redis.call('DEL', key)
        else
          redis.call('SET', key, string.format('%d', back), 'PX', math.ceil((back - now) / 1000))
        end
      end
    end
  end
end
return 1
