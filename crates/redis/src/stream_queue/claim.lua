-- Claims for consumer ARGV[2] of group ARGV[1] up to ARGV[4] messages that another consumer
-- took and has not touched for ARGV[3] ms: that consumer's instance stopped (its live
-- messages are touched far more often, see keep.lua).
--
-- KEYS[1]  the queue's stream
--
-- Returns the claimed entries, {{entry id, {field, value, ...}}, ...}. XAUTOCLAIM scans the
-- pending list a page at a time; a few pages are walked so that a long list of live entries
-- ahead does not hide stale ones. No stream or no group yet: nothing to claim.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local wanted = tonumber(ARGV[4])
local out = {}
local cursor = '0-0'
for _ = 1, 8 do
  local ok, r = pcall(redis.call, 'XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], cursor,
    'COUNT', wanted - #out)
  if not ok then
    local text = tostring(r.err or r)
    if string.find(text, 'NOGROUP', 1, true) then
      return out
    end
    return redis.error_reply(text)
  end
  cursor = r[1]
  for _, e in ipairs(r[2]) do
    -- Redis 6.2 lists entries deleted from the stream as nil: nothing to deliver.
    if e then
      out[#out + 1] = e
    end
  end
  if cursor == '0-0' or #out >= wanted then
    break
  end
end
return out
