-- Touches the pending entries ARGV[4..] that consumer ARGV[2] of group ARGV[1] still owns,
-- setting their idle time to ARGV[3] ms: 0 to keep them (a heartbeat, so nobody claims a
-- message its instance is still working on), or past the claim timeout to hand them over at
-- once (a clean shutdown).
--
-- KEYS[1]  the queue's stream
--
-- Returns the entries the consumer no longer owns (another consumer claimed them, or they
-- are gone): its instance must not deliver or acknowledge them as its own.
local lost = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
