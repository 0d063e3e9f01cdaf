  -- Integers past 2^53, where a double is no longer exact: the time a charge far past the limit
  -- puts a bucket at (up to 2^63 - 1, the latest the algorithms let a bucket's time be). Such a
  -- value is a decimal string; split(x) gives it (or a number) as h x 10^9 + l, both parts
  -- exact; join(h, l) takes one carry or borrow in l and gives the value back: a number below
  -- 2^53, else a string, capped at 2^63 - 1. (A block: the scripts splice it in only where a
  -- value is that large, so no usual call creates these functions.)
  local function split(x)
    if type(x) == 'number' then
      local h = math.floor(x / 1000000000)
      return h, x - h * 1000000000
    end
    return tonumber(string.sub(x, 1, -10)) or 0, tonumber(string.sub(x, -9))
  end
  local function join(h, l)
    if l < 0 then
      h, l = h - 1, l + 1000000000
    elseif l >= 1000000000 then
      h, l = h + 1, l - 1000000000
    end
    local v = h * 1000000000 + l
    if v < 9007199254740992 then return v end
    if h > 9223372036 or (h == 9223372036 and l > 854775807) then
      return '9223372036854775807'
    end
    return string.format('%d%09d', h, l)
  end
