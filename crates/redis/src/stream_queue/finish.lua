-- A message is done: acknowledged and deleted from the stream (so the stream's length stays
-- the queue's depth), and its status kept for ARGV[7] ms.
--
-- KEYS[1]  the queue's stream     KEYS[2]  the message's status hash
-- ARGV[1]  the group   ARGV[2]  the entry id   ARGV[3]  the final state ("delivered")
-- ARGV[4]  the upstream's status code   ARGV[5]  an error text ("" for none)
-- ARGV[6]  now (ms since the epoch)     ARGV[7]  how long the status is kept (ms)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'state', ARGV[3], 'status', ARGV[4], 'error', ARGV[5],
  'updated', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return 1
