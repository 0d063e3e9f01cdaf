-- Takes up to ARGV[3] messages no consumer has seen yet, for consumer ARGV[2] of group ARGV[1]
-- (XREADGROUP: each goes to exactly one consumer and stays pending until acknowledged).
--
-- KEYS[1]  the queue's stream
--
-- Returns the entries as XREADGROUP gives them: {{entry id, {field, value, ...}}, ...}. The
-- group is created (from the stream's start) when the stream or the group is missing.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
  return {}
end
local ok, reply = pcall(redis.call, 'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
  'STREAMS', KEYS[1], '>')
if not ok then
  local text = tostring(reply.err or reply)
  if string.find(text, 'NOGROUP', 1, true) then
    redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
    return {}
  end
  return redis.error_reply(text)
end
if not reply then
  return {}
end
return reply[1][2]
