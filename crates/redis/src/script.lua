--! Tollgate's one server-side script: the five algorithms of crates/core/src/algorithm/*.rs,
--! ported line by line, applied to several checks atomically and all-or-nothing.
--
-- Why one generic script: a request checked against several policies must be decided in ONE
-- atomic step (Redis runs a script without interleaving), and one script means one SHA to load.
--
-- KEYS[i]  the state key of check i (several checks may name the same key: they count twice).
-- ARGV[1]  op: "a" apply (commit when every check admits), "d" dry run (decide, write nothing,
--          report admitting checks as their quota stands), "r" refund.
-- ARGV[2]  now in microseconds since the epoch, or "-1" to read the server's clock (TIME), so
--          instances with skewed clocks agree.
-- ARGV[3 + 5(i-1) ..] per check: algorithm code, p1, p2, p3, cost.
--   1 fixed window            limit, window_us, 0
--   2 sliding window log      limit, window_us, 0
--   3 sliding window counter  limit, window_us, 0
--   4 token bucket            capacity, interval_us, 0
--   5 leaky bucket            burst (queue + 1), interval_us, max_delay_us or -1
--
-- Reply: 6 integers per check: allowed (0/1), limit, remaining, reset_us, retry_after_us (-1 for
-- none: the cost can never pass), delay_us.
--
-- Arithmetic: Lua numbers are doubles, exact for integers below 2^53. Timestamps (~2^51) plus the
-- quota horizons the core allows stay below that. The sliding window counter's products
-- (count x window, up to 2^77) go through mul_div, exact at any size; the client refuses only
-- leaky buckets deeper than 2^51 us (71 years).

local floor = math.floor

-- floor(a / b) for non-negative integers, corrected so a rounded quotient never lands on the
-- wrong side of an integer.
local function idiv(a, b)
  local q = floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

local function fmt(n) return string.format('%.0f', n) end

-- The verdict of a cost the quota can never admit.
local function never(limit, remaining, reset)
  return {0, limit, remaining, reset, -1, 0}
end

---------------------------------------------------------------- state load / store

local function load(key, alg)
  if alg == 2 then
    local raw = redis.call('LRANGE', key, 0, -1)
    local ts, cs, total = {}, {}, 0
    for i = 1, #raw do
      local sp = string.find(raw[i], ' ', 1, true)
      ts[i] = tonumber(string.sub(raw[i], 1, sp - 1))
      cs[i] = tonumber(string.sub(raw[i], sp + 1))
      total = total + cs[i]
    end
    -- orig: entries as stored; touched: the lowest index changed since (writes keep what
    -- lies below it and rewrite only the tail).
    return {ts = ts, cs = cs, head = 1, n = #raw, total = total, orig = #raw, touched = #raw + 1}
  end
  local raw = redis.call('GET', key)
  local a, b, c = 0, 0, 0
  if raw then
    local p = {}
    for w in string.gmatch(raw, '%d+') do p[#p + 1] = tonumber(w) end
    a, b, c = p[1] or 0, p[2] or 0, p[3] or 0
  end
  return {a = a, b = b, c = c}
end

local function store(key, alg, s, expires_at, now)
  if expires_at <= now then
    -- Equivalent to a key never seen: nothing to keep.
    redis.call('DEL', key)
    return
  end
  -- Relative TTL of one full reset, in the caller's time base, so a caller-supplied clock far
  -- from the server's never expires keys early or keeps them forever.
  local ttl = math.ceil((expires_at - now) / 1000)
  if ttl < 1 then ttl = 1 end
  if alg == 2 then
    -- Stored entries 1..keep are unchanged: trim the pruned head and the changed tail off the
    -- list and push the new tail, so a commit costs O(pruned + 1) writes, not O(limit).
    local keep = math.min(s.touched - 1, s.orig, s.n)
    local from = keep + 1
    if keep < s.head then
      redis.call('DEL', key)
      from = s.head
    elseif s.head > 1 or keep < s.orig then
      redis.call('LTRIM', key, s.head - 1, keep - 1)
    end
    local batch = {}
    for i = from, s.n do
      batch[#batch + 1] = fmt(s.ts[i]) .. ' ' .. fmt(s.cs[i])
      if #batch == 500 then
        redis.call('RPUSH', key, unpack(batch))
        batch = {}
      end
    end
    if #batch > 0 then redis.call('RPUSH', key, unpack(batch)) end
    redis.call('PEXPIRE', key, ttl)
  elseif alg == 1 then
    redis.call('SET', key, fmt(s.a) .. ' ' .. fmt(s.b), 'PX', ttl)
  elseif alg == 3 then
    redis.call('SET', key, fmt(s.a) .. ' ' .. fmt(s.b) .. ' ' .. fmt(s.c), 'PX', ttl)
  else
    redis.call('SET', key, fmt(s.a), 'PX', ttl)
  end
end

---------------------------------------------------------------- fixed window
-- state: a = window_end, b = count

local function fw_normalize(s, now, w)
  local e = (idiv(now, w) + 1) * w
  if s.a < e then s.a = e; s.b = 0 end
end

local function fw_evaluate(s, now, cost, limit, w)
  fw_normalize(s, now, w)
  local until_end = sat_sub(s.a, now)
  local used = s.b
  local available = sat_sub(limit, used)
  local reset = 0
  if used > 0 then reset = until_end end
  if cost > limit then return never(limit, available, reset) end
  if used + cost <= limit then
    local r = 0
    if used + cost > 0 then r = until_end end
    return {1, limit, available - cost, r, -1, 0}
  end
  return {0, limit, available, reset, until_end, 0}
end

---------------------------------------------------------------- sliding window log
-- state: parallel arrays ts/cs from head to n, total

local function sl_prune(s, now, w)
  while s.head <= s.n and s.ts[s.head] + w <= now do
    s.total = s.total - s.cs[s.head]
    s.head = s.head + 1
  end
end

local function sl_evaluate(s, now, cost, limit, w)
  sl_prune(s, now, w)
  local available = sat_sub(limit, s.total)
  local newest = 0
  if s.n >= s.head then newest = sat_sub(s.ts[s.n] + w, now) end
  if cost > limit then return never(limit, available, newest) end
  if s.total + cost <= limit then
    local r = newest
    if cost > 0 then r = w end
    return {1, limit, available - cost, r, -1, 0}
  end
  -- Admitted once enough of the oldest entries have left the window.
  local must_free = s.total + cost - limit
  local freed, retry = 0, newest
  for i = s.head, s.n do
    freed = freed + s.cs[i]
    if freed >= must_free then
      retry = sat_sub(s.ts[i] + w, now)
      break
    end
  end
  return {0, limit, available, newest, retry, 0}
end

local function sl_commit(s, now, cost, w)
  if cost == 0 then return end
  sl_prune(s, now, w)
  if s.n >= s.head and s.ts[s.n] == now then
    s.cs[s.n] = s.cs[s.n] + cost
  else
    s.n = s.n + 1
    s.ts[s.n] = now
    s.cs[s.n] = cost
  end
  s.touched = math.min(s.touched, s.n)
  s.total = s.total + cost
end

local function sl_refund(s, now, cost, w)
  sl_prune(s, now, w)
  local left = cost
  while left > 0 and s.n >= s.head do
    s.touched = math.min(s.touched, s.n)
    local take = math.min(left, s.cs[s.n])
    s.cs[s.n] = s.cs[s.n] - take
    left = left - take
    s.total = s.total - take
    if s.cs[s.n] == 0 then s.n = s.n - 1 end
  end
end

---------------------------------------------------------------- sliding window counter
-- state: a = window_end, b = current, c = previous

local function sc_normalize(s, now, w)
  local e = (idiv(now, w) + 1) * w
  if s.a < e then
    local previous = 0
    if s.a + w == e then previous = s.b end
    s.a = e; s.b = 0; s.c = previous
  end
end

local function sc_reset(we, current, previous, now, w)
  if current > 0 then return sat_sub(we + w, now) end
  if previous > 0 then return sat_sub(we, now) end
  return 0
end

-- floor(a * b / d) for non-negative integers a, b < 2^53 and 0 < d < 2^45, exactly, and
-- whether the division left a remainder. The product may exceed 2^53 (a sliding window counter
-- with limit x window beyond it): then it is computed in base-256 limbs, where every partial
-- product and every step of the long division stays below 2^53. Quotients above 2^52 are
-- returned as 2^52: callers only compare them with durations below 2^46.
local TWO53 = 9007199254740992
local TWO52 = 4503599627370496
local function limbs(n)
  local t = {}
  while n > 0 do
    local q = floor(n / 256)
    t[#t + 1] = n - q * 256
    n = q
  end
  return t
end
local function mul_div(a, b, d)
  local p = a * b
  if p < TWO53 then
    local q = idiv(p, d)
    return q, q * d < p
  end
  local x, y, r = limbs(a), limbs(b), {}
  for k = 1, #x + #y do r[k] = 0 end
  for i = 1, #x do
    for j = 1, #y do r[i + j - 1] = r[i + j - 1] + x[i] * y[j] end
  end
  for k = 1, #r - 1 do
    local c = floor(r[k] / 256)
    r[k] = r[k] - c * 256
    r[k + 1] = r[k + 1] + c
  end
  -- Long division, most significant limb first: the running remainder stays below d < 2^45,
  -- so remainder x 256 + limb stays below 2^53.
  local rem, q = 0, 0
  for k = #r, 1, -1 do
    local cur = rem * 256 + r[k]
    local digit = idiv(cur, d)
    rem = cur - digit * d
    if q < TWO52 then q = q * 256 + digit end
  end
  if q > TWO52 then q = TWO52 end
  return q, rem > 0
end

local function sc_evaluate(s, now, cost, limit, w)
  sc_normalize(s, now, w)
  local start = s.a - w
  local overlap = w - math.min(sat_sub(now, start), w)
  local previous, current = s.c, s.b
  -- The pure algorithm compares previous x overlap + (current + cost) x window with
  -- limit x window. With c = ceil(previous x overlap / window), exactly:
  --   admitted  <=>  current + cost + c <= limit
  --   remaining  =   max(0, limit - counted - c)
  local q, partial = mul_div(previous, overlap, w)
  local c = q
  if partial then c = q + 1 end
  local function available(counted)
    local left = limit - counted - c
    if left > 0 then return left end
    return 0
  end
  if cost > limit then
    return never(limit, available(current), sc_reset(s.a, current, previous, now, w))
  end
  if current + cost + c <= limit then
    return {1, limit, available(current + cost), sc_reset(s.a, current + cost, previous, now, w), -1, 0}
  end
  local until_end = sat_sub(s.a, now)
  local retry
  if current + cost <= limit then
    -- Still in this window, once the previous window's weight has shrunk enough.
    local fits = mul_div(limit - current - cost, w, math.max(previous, 1))
    retry = sat_sub(overlap, fits)
  else
    -- In the next window, where this window's count becomes the weighted one.
    local fits = mul_div(limit - cost, w, math.max(current, 1))
    retry = until_end + sat_sub(w, fits)
  end
  return {0, limit, available(current), sc_reset(s.a, current, previous, now, w), retry, 0}
end

---------------------------------------------------------------- token bucket (GCRA)
-- state: a = tat

local function tb_evaluate(s, now, cost, cap, interval)
  local tat = math.max(s.a, now)
  local horizon = cap * interval
  local tokens = idiv(now + horizon - tat, interval)
  if cost > cap then return never(cap, tokens, tat - now) end
  local new_tat = tat + cost * interval
  if new_tat - now <= horizon then
    return {1, cap, idiv(now + horizon - new_tat, interval), new_tat - now, -1, 0}
  end
  return {0, cap, tokens, tat - now, new_tat - horizon - now, 0}
end

---------------------------------------------------------------- leaky bucket
-- state: a = next_free

local function lb_room(e, now, burst, interval, maxd)
  local depth = burst * interval
  local backlog = sat_sub(e, now)
  local by_queue = idiv(sat_sub(depth, backlog), interval)
  if maxd < 0 then return by_queue end
  if backlog > maxd then return 0 end
  return math.min(by_queue, idiv(maxd - backlog, interval) + 1)
end

local function lb_evaluate(s, now, cost, burst, interval, maxd)
  local start = math.max(s.a, now)
  local wait = start - now
  if cost > burst then return never(burst, lb_room(start, now, burst, interval, maxd), wait) end
  local depth = burst * interval
  local e = start + cost * interval
  local fits_queue = e - now <= depth
  local fits_delay = maxd < 0 or wait <= maxd
  if fits_queue and fits_delay then
    return {1, burst, lb_room(e, now, burst, interval, maxd), e - now, -1, wait}
  end
  local by_queue = sat_sub(e, depth)
  local by_delay = 0
  if maxd >= 0 then by_delay = sat_sub(start, maxd) end
  return {0, burst, lb_room(start, now, burst, interval, maxd), wait,
          sat_sub(math.max(by_queue, by_delay), now), 0}
end

---------------------------------------------------------------- dispatch

local function evaluate(alg, s, now, cost, p1, p2, p3)
  if alg == 1 then return fw_evaluate(s, now, cost, p1, p2)
  elseif alg == 2 then return sl_evaluate(s, now, cost, p1, p2)
  elseif alg == 3 then return sc_evaluate(s, now, cost, p1, p2)
  elseif alg == 4 then return tb_evaluate(s, now, cost, p1, p2)
  elseif alg == 5 then return lb_evaluate(s, now, cost, p1, p2, p3)
  end
  return redis.error_reply('tollgate: unknown algorithm code ' .. tostring(alg))
end

local function commit(alg, s, now, cost, p1, p2)
  if alg == 1 then fw_normalize(s, now, p2); s.b = s.b + cost
  elseif alg == 2 then sl_commit(s, now, cost, p2)
  elseif alg == 3 then sc_normalize(s, now, p2); s.b = s.b + cost
  elseif alg == 4 then s.a = math.max(s.a, now) + cost * p2
  elseif alg == 5 then s.a = math.max(s.a, now) + cost * p2
  end
end

local function refund(alg, s, now, cost, p1, p2)
  if alg == 1 then fw_normalize(s, now, p2); s.b = sat_sub(s.b, cost)
  elseif alg == 2 then sl_refund(s, now, cost, p2)
  elseif alg == 3 then sc_normalize(s, now, p2); s.b = sat_sub(s.b, cost)
  elseif alg == 4 then
    local back = cost * p2
    s.a = math.max(sat_sub(s.a, back), math.min(now, s.a))
  elseif alg == 5 then
    if s.a > now then s.a = math.max(sat_sub(s.a, cost * p2), now) end
  end
end

-- When the state is equivalent to a key never seen (the algorithms' expires_at).
local function expires_at(alg, s, p2)
  if alg == 2 then
    if s.n >= s.head then return s.ts[s.n] + p2 end
    return 0
  elseif alg == 3 then
    if s.b > 0 then return s.a + p2 end
    if s.c > 0 then return s.a end
    return 0
  end
  return s.a
end

local op = ARGV[1]
local now = tonumber(ARGV[2])
if now < 0 then
  -- Redis before 5 replicates scripts verbatim and refuses writes after TIME unless the
  -- script switches to effects replication (from 5 on this is the default and a no-op).
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n = #KEYS
local checks = {}
for i = 1, n do
  local b = 2 + (i - 1) * 5
  checks[i] = {
    alg = tonumber(ARGV[b + 1]), p1 = tonumber(ARGV[b + 2]), p2 = tonumber(ARGV[b + 3]),
    p3 = tonumber(ARGV[b + 4]), cost = tonumber(ARGV[b + 5]),
  }
end

-- One state per distinct key, loaded once: a key named twice sees its own earlier commit.
local states, dirty = {}, {}
local function state_of(i)
  local key = KEYS[i]
  local s = states[key]
  if not s then
    s = load(key, checks[i].alg)
    states[key] = s
  end
  return s
end

local function write_dirty()
  for i = 1, n do
    local key = KEYS[i]
    if dirty[key] then
      dirty[key] = nil
      local c = checks[i]
      store(key, c.alg, states[key], expires_at(c.alg, states[key], c.p2), now)
    end
  end
end

if op == 'r' then
  for i = 1, n do
    local c = checks[i]
    refund(c.alg, state_of(i), now, c.cost, c.p1, c.p2)
    dirty[KEYS[i]] = true
  end
  write_dirty()
  return {}
end

local out, verdicts = {}, {}
local all_allowed = true
for i = 1, n do
  local c = checks[i]
  local s = state_of(i)
  local v = evaluate(c.alg, s, now, c.cost, c.p1, c.p2, c.p3)
  if v.err then return v end
  verdicts[i] = v
  if v[1] == 1 then
    -- Tentative: written only if every check admits (and never in a dry run).
    if all_allowed and c.cost > 0 then
      commit(c.alg, s, now, c.cost, c.p1, c.p2)
      dirty[KEYS[i]] = true
    end
  else
    all_allowed = false
  end
end

if all_allowed and op == 'a' then
  write_dirty()
else
  -- Nothing is consumed: report each admitting check's quota as it stands (cost 0 on the state
  -- as stored, since no tentative commit was written).
  for i = 1, n do
    if verdicts[i][1] == 1 then
      local c = checks[i]
      verdicts[i] = evaluate(c.alg, load(KEYS[i], c.alg), now, 0, c.p1, c.p2, c.p3)
    end
  end
end

for i = 1, n do
  local v = verdicts[i]
  for j = 1, 6 do out[#out + 1] = v[j] end
end
return out
