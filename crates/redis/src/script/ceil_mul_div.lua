  -- q = ceil(a x b / d) for non-negative integers a, b < 2^53 and 0 < d < 2^45, exactly, when
  -- the product passes 2^53 (a sliding window counter whose limit x window does): long
  -- multiplication and division in base-256 limbs, where every step stays below 2^53. The
  -- quotients are at most a (< 2^32), so they stay exact too. (A block, not a function: the
  -- scripts splice it in where they need it, so no call creates a closure for it.)
  local x, y, r = {}, {}, {}
  while a > 0 do local h = math.floor(a / 256); x[#x + 1] = a - h * 256; a = h end
  while b > 0 do local h = math.floor(b / 256); y[#y + 1] = b - h * 256; b = h end
  for k = 1, #x + #y do r[k] = 0 end
  for i = 1, #x do for j = 1, #y do r[i + j - 1] = r[i + j - 1] + x[i] * y[j] end end
  for k = 1, #r - 1 do local h = math.floor(r[k] / 256); r[k] = r[k] - h * 256; r[k + 1] = r[k + 1] + h end
  local rem = 0
  q = 0
  for k = #r, 1, -1 do
    local part = rem * 256 + r[k]
    local digit = math.floor(part / d)
    rem = part - digit * d
    q = q * 256 + digit
  end
  if rem > 0 then q = q + 1 end
