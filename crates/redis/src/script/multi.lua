--! Several checks, all-or-nothing: every check's cost is written only if every check admits;
--! or, charged whatever the quota says (a usage report, a true-up once a response is out).
-- Runs after a clock prelude that defines `now` (µs); ceil_mul_div.lua is spliced in below. Why one script: a
-- request checked against several policies must be decided in one atomic step, and Redis runs
-- a script without interleaving. The caller replays the checks with the pure algorithms on the
-- states this script reports (as the memory store does), so it only decides what to write.
--
-- KEYS[i]  the state key of check i (several checks may name one key: they count twice), then
--          the lockout record of each check whose policy bans (see below)
-- ARGV[1]  1: write when every check admits; 0: a dry run, nothing written; 2: charge every
--          check's cost whatever its quota says, and write it (never refused)
-- ARGV[2]  m, how many lockout records follow the state keys (0 with mode 2)
-- ARGV[3 + 5(i-1) ..] per check: algorithm, p1, p2, p3, cost (for 4 and 5, the step instead:
--          cost x interval µs, at most 2^63 - 1, as the caller multiplies it exactly)
--   1 fixed window            window_us, limit, 0; or for a calendar window, the period's
--                             end (µs), limit, the next period's end (taken when this clock
--                             has passed the first)
--   2 sliding window log      window_us, limit, how many of the oldest units to report
--   3 sliding window counter  window_us, limit, 0
--   4 token bucket            interval_us, horizon_us, 0
--   5 leaky bucket            interval_us, depth_us, max_delay_us (2^52 for none)
--   (A bucket's time past 2^53, which only a charge far past the limit reaches, is kept
--   exact as a decimal string, and reported so; see big_time.lua.)
--   6 concurrency             lease_ttl_us, limit, the permit's id (16 hex digits: a string,
--                             never converted, since a Lua number cannot hold a 64-bit id)
-- Reply: now, all admitted (0/1), then per check its key's state before this request, as the
-- one-check scripts report it: fixed e c | log total newest n ts_1..ts_n (the n oldest units)
-- | counter e current previous | token tat | leaky next_free | concurrency others own first
-- (absolute µs, 0 for none), as the check's permit sees the key after the permits that the
-- request's earlier checks took, while all of them admitted.
-- Lockouts (crates/core/src/ban.rs has the state machine; the caller replays it on what this
-- script reports and refuses a reply that disagrees): after the checks, per record j: the index
-- of its check, after, within_us, for_us, the key as the caller names it (kept for listing).
-- A check whose key is banned (now < until) is refused without its quota being asked, and
-- counted in the ban's denials unless it is a peek (cost 0); a check its own quota refuses (cost
-- above 0) counts a denial, which may start a ban. In modes 0 and 1.
-- The reply then ends with, per record: its state before (streak start, denials, since, until)
-- and what was done: 0 nothing, 1 refused while banned, 2 a denial counted, 3 a ban started.
local m = tonumber(ARGV[2])
local n = #KEYS - m
local commit = ARGV[1] ~= '0'
local force = ARGV[1] == '2'
local states, out = {}, {now, 1}

-- The lockout records, by the index of their check.
local bans, order = {}, {}
for j = 1, m do
  local b = 3 + 5 * n + (j - 1) * 5
  local v = redis.call('HMGET', KEYS[n + j], 's', 'd', 'b', 'u')
  local st = {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'),
    tonumber(v[4] or '0')}
  local i = tonumber(ARGV[b])
  bans[i] = {key = KEYS[n + j], after = tonumber(ARGV[b + 1]), within = tonumber(ARGV[b + 2]),
    dur = tonumber(ARGV[b + 3]), text = ARGV[b + 4], st = st, banned = now < st[4], code = 0}
  order[j] = i
end

local function load(key, alg, p1, p2, p3)
  local v
  if alg ~= 2 and alg ~= 6 then v = redis.call('GET', key) end
  if alg == 1 then
    local e, c = now - now % p1 + p1, 0
    if p3 > 0 then
      e = p1
      if now >= e then e = p3 end
      if e <= now then error('the calendar period given ends before now') end
    end
    if v then
      local se, sc = string.match(v, '^(%d+) (%d+)$')
      se = tonumber(se)
      if se >= e then e, c = se, tonumber(sc) end
    end
    return {e = e, c = c, report = {e, c}}
  elseif alg == 3 then
    local e, cur, prev = now - now % p1 + p1, 0, 0
    if v then
      local se, sc, sp = string.match(v, '^(%d+) (%d+) (%d+)$')
      se = tonumber(se)
      if se >= e then e, cur, prev = se, tonumber(sc), tonumber(sp)
      elseif se + p1 == e then prev = tonumber(sc) end
    end
    local since = now - e + p1
    if since < 0 then since = 0 elseif since > p1 then since = p1 end
    local p = prev * (p1 - since)
    local q
    if p < 9007199254740992 then
      q = math.floor(p / p1)
      if q * p1 < p then q = q + 1 end
    else
      local a, b, d = prev, p1 - since, p1
      --[[ceil_mul_div]]
    end
    return {e = e, c = cur, prev = prev, weighted = q, report = {e, cur, prev}}
  elseif alg == 6 then
    -- A permit expiring at e is live while now < e. `c` counts the live permits with those
    -- this request takes; `taken` holds the ids it takes (or renews), which expire at now + p1.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
    return {c = redis.call('ZCARD', key), taken = {}, ntaken = 0, report = {}}
  elseif alg == 2 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - p1))
    local total = redis.call('ZCARD', key)
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local newest = 0
    if top[2] then newest = tonumber(top[2]) end
    local report = {total, newest}
    local want = p3
    if want > total then want = total end
    report[3] = want
    if want > 0 then
      local oldest = redis.call('ZRANGE', key, 0, want - 1, 'WITHSCORES')
      for i = 2, #oldest, 2 do report[#report + 1] = tonumber(oldest[i]) end
    end
    return {c = total, added = 0, newest = newest, top = top[1], report = report}
  end
  local stored = tonumber(v or 0)
  -- Past 2^53 a double is not exact: the stored string itself.
  if stored >= 9007199254740992 then stored = v end
  return {t = stored, report = {stored}}
end

-- A concurrency key's permits as permit `id` sees them: the live permits but its own, the
-- earliest expiry among them (0: none) and its own expiry (0: not held), counting the permits
-- this request took before (at now + ttl) rather than their stored scores.
local function occupancy(key, s, id, ttl)
  local own = 0
  if s.taken[id] then
    own = now + ttl
  else
    local score = redis.call('ZSCORE', key, id)
    if score then own = tonumber(score) end
  end
  local others = s.c
  if own > 0 then others = others - 1 end
  local first = 0
  if others > 0 then
    for t, _ in pairs(s.taken) do
      if t ~= id then
        first = now + ttl
        break
      end
    end
    -- The earliest stored permit neither this one nor taken by this request: among the
    -- ntaken + 2 earliest, at most ntaken + 1 are excluded.
    local range = redis.call('ZRANGE', key, 0, s.ntaken + 1, 'WITHSCORES')
    for i = 1, #range, 2 do
      if range[i] ~= id and not s.taken[range[i]] then
        local score = tonumber(range[i + 1])
        if first == 0 or score < first then first = score end
        break
      end
    end
  end
  return others, own, first
end

-- Whether check (alg, p.., cost) admits on state s (always, when forced); if so, counts it in s.
-- A bucket's step is `cost` as a number and `step` exactly (a string past 2^53).
local function take(s, alg, p1, p2, p3, cost, step)
  if alg == 6 then
    -- A charge takes no permit: a concurrency limit counts requests in flight, not usage.
    if force or cost == 0 then return true end
    if s.others + cost > p2 then return false end
    if s.own == 0 then s.c = s.c + 1 end
    if not s.taken[p3] then
      s.taken[p3] = true
      s.ntaken = s.ntaken + 1
    end
  elseif alg == 1 or alg == 2 then
    if not force and s.c + cost > p2 then return false end
    s.c = s.c + cost
    if alg == 2 then
      s.added = s.added + cost
    elseif s.c > 4294967295 then
      -- A charge's count saturates, as the algorithm's (a u32) does.
      s.c = 4294967295
    end
  elseif alg == 3 then
    if not force and s.c + cost + s.weighted > p2 then return false end
    s.c = s.c + cost
    if s.c > 4294967295 then s.c = 4294967295 end
  else
    -- Both buckets: the new time is max(time, now) + cost x interval (the step); the token
    -- bucket admits while it is within the horizon of now, the leaky bucket while it is within
    -- the depth and the wait (from max(time, now)) within max_delay.
    local start = s.t
    if type(start) == 'number' and start < now then start = now end
    local e
    if type(start) == 'number' and type(step) == 'number' then e = start + step end
    if not force then
      -- Past 2^53 is further ahead than any horizon or depth (at most 100 years).
      if not e or e - now > p2 or (alg == 5 and start - now > p3) then return false end
    end
    if not e or e >= 9007199254740992 then
      -- A charge far past the limit: exact, and capped at 2^63 - 1 as the algorithms cap it.
      --[[big_time]]
      local h, l = split(start)
      local sh, sl = split(step)
      e = join(h + sh, l + sl)
    end
    s.t = e
  end
  return true
end

local function write(key, s, alg, p1, p2)
  if alg == 6 then
    if s.ntaken == 0 then return end
    local expires = string.format('%d', now + p1)
    local args = {}
    for id, _ in pairs(s.taken) do
      args[#args + 1] = expires
      args[#args + 1] = id
    end
    redis.call('ZADD', key, unpack(args))
    -- The key lives as long as its newest permit, and no longer.
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    if newest < now + p1 then newest = now + p1 end
    redis.call('PEXPIRE', key, math.ceil((newest - now) / 1000))
  elseif alg == 1 then
    redis.call('SET', key, string.format('%d %d', s.e, s.c), 'PX', math.ceil((s.e - now) / 1000))
  elseif alg == 3 then
    redis.call('SET', key, string.format('%d %d %d', s.e, s.c, s.prev), 'PX',
      math.ceil((s.e + p1 - now) / 1000))
  elseif alg == 2 then
    local ss = string.format('%d', now)
    -- The members already at this score, 1..first; the top one is named
    -- "<score>:<index>+<more>" when it stands for `more` units besides itself.
    local top
    if s.newest == now then
      top = s.top
    elseif s.newest > now then
      top = redis.call('ZREVRANGEBYSCORE', key, ss, ss, 'LIMIT', 0, 1)[1]
    end
    local first, more = 0, 0
    if top then
      first = tonumber(string.match(top, '^%d+:(%d+)'))
      more = tonumber(string.match(top, '%+(%d+)$') or '0')
    end
    -- A log admits nothing while it holds more than its limit, and a score's units count in
    -- every decision only as far as limit + 1: so a score keeps at most limit + 1 members, and
    -- the units past them (a charge far past the limit) are counted in its top member's name,
    -- for refunds. The units of one score saturate at 2^32 - 1, as a log entry's cost does.
    -- This bounds the call's work by the quota, whatever the cost charged.
    local units = first + more + s.added
    if units > 4294967295 then units = 4294967295 end
    local m = p2 + 1
    if m > units then m = units end
    if m < first then m = first end
    local over = units - m
    if m > first or over ~= more then
      local args = {}
      if more > 0 or m == first then
        -- The top member's count changes (or it is no longer the top): named anew.
        redis.call('ZREM', key, top)
        first = first - 1
      end
      for i = first + 1, m do
        args[#args + 1] = ss
        if i == m and over > 0 then
          args[#args + 1] = string.format('%s:%010d+%d', ss, i, over)
        else
          args[#args + 1] = string.format('%s:%010d', ss, i)
        end
        if #args == 1000 or i == m then
          redis.call('ZADD', key, unpack(args))
          args = {}
        end
      end
    end
    local last = s.newest
    if now > last then last = now end
    redis.call('PEXPIRE', key, math.ceil((last + p1 - now) / 1000))
  elseif type(s.t) == 'string' then
    -- Past 2^53 (see take); the TTL need not be exact, only no shorter.
    redis.call('SET', key, s.t, 'PX',
      string.format('%d', math.ceil((tonumber(s.t) - now) / 1000) + 2))
  else
    redis.call('SET', key, string.format('%d', s.t), 'PX', math.ceil((s.t - now) / 1000))
  end
end

local all, dirty, denied, costs = true, {}, {}, {}
for i = 1, n do
  local b = 2 + (i - 1) * 5
  local alg, p1, p2, p3, cost = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), ARGV[b + 4], tonumber(ARGV[b + 5])
  -- A bucket's step past 2^53 (a charge far past the limit) is exact as its string only.
  local step = cost
  if cost >= 9007199254740992 then step = ARGV[b + 5] end
  if alg ~= 6 then p3 = tonumber(p3) end
  local key = KEYS[i]
  local s = states[key]
  if not s then
    s = load(key, alg, p1, p2, p3)
    states[key] = s
  end
  for _, x in ipairs(s.report) do out[#out + 1] = x end
  if alg == 6 then
    local others, own, first = occupancy(key, s, p3, p1)
    s.others, s.own = others, own
    out[#out + 1] = others
    out[#out + 1] = own
    out[#out + 1] = first
  end
  costs[i] = cost
  local ban = bans[i]
  if ban and ban.banned then
    all = false
  elseif all then
    if take(s, alg, p1, p2, p3, cost, step) then
      if cost > 0 then dirty[key] = {s, alg, p1, p2} end
    else
      all = false
      denied[i] = true
    end
  elseif ban and cost > 0 then
    -- Decided after another check refused the request: its own verdict, on a copy.
    local t = {}
    for k, v in pairs(s) do t[k] = v end
    if alg ~= 6 and not take(t, alg, p1, p2, p3, cost, step) then denied[i] = true end
  end
end
if not all then
  out[2] = 0
elseif commit then
  for key, d in pairs(dirty) do write(key, d[1], d[2], d[3], d[4]) end
end
for j = 1, m do
  local i = order[j]
  local ban = bans[i]
  local st = ban.st
  for _, x in ipairs(st) do out[#out + 1] = x end
  if ban.banned then
    -- Refused; counted in the ban's denials unless a peek (cost 0), which is no denial.
    if costs[i] > 0 then redis.call('HINCRBY', ban.key, 'd', 1) end
    ban.code = 1
  elseif denied[i] and costs[i] > 0 then
    local s0, d, since, untl = st[1], st[2], st[3], st[4]
    if d == 0 or now >= s0 + ban.within or (untl ~= 0 and untl <= now) then
      s0, d, since, untl = now, 0, 0, 0
    end
    d = d + 1
    ban.code = 2
    if d >= ban.after then
      since, untl = now, now + ban.dur
      ban.code = 3
    end
    local f = '%d'
    redis.call('HSET', ban.key, 's', string.format(f, s0), 'd', string.format(f, d),
      'b', string.format(f, since), 'u', string.format(f, untl), 'k', ban.text)
    local ends = s0 + ban.within
    if untl > ends then ends = untl end
    redis.call('PEXPIRE', ban.key, math.ceil((ends - now) / 1000))
  end
  out[#out + 1] = ban.code
end
return out
