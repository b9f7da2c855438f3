#!lua name=sessionscope_8
-- The server side of sessionscope's Redis store (library version 8).
--
-- Every function touches the keys of one hash slot only: the keys of one
-- (app, user) pair, or of one app. The client builds every key name and
-- passes it in KEYS; the layout is described in docs/ARCHITECTURE.md.
-- Times travel as the decimal text the client wrote (shortest round-trip
-- form), so no float is ever formatted here and no precision is lost.
-- Values are msgpack bytes and are stored as they arrive.

local HAS_MARKER, HAS_LAST_ID, LOCKED, CATCH_UP = 1, 2, 4, 8
-- Which optional parts of an append request's arguments follow its flags.
local CALLER, ITEMS, APP, COUNTED = 16, 32, 64, 128
-- The flags of a locked request without state, as the client sends them.
local PLAIN_LOCKED = '4'
-- Applied app-delta tokens are remembered this long (seconds).
local APPLIED_HORIZON = 86400
-- Fields read per HMGET, well under Lua's limit on unpacked arguments.
local CHUNK = 1000

-- The code that starts the error of a session record altered by hand: the
-- client reports it as a corrupt session (the rest of the text names it).
local CORRUPT = 'SESSIONSCOPE_CORRUPT'

-- A session id as the error of a damaged record shows it: quoted, cut, and
-- with control characters (which an error reply cannot carry) replaced.
local function shown(id)
    return "'" .. (string.gsub(string.sub(id or '', 1, 100), '%c', '?')) .. "'"
end

-- A record's event count and removed count ('k' and 'r', the text read), as
-- numbers. Counts altered by hand (not whole numbers, or more removed than
-- counted) fail the call with the CORRUPT error naming the session; every
-- function reads them before it writes anything, so nothing is written.
local function counts_of(rec_key, count, removed)
    removed = removed or '0'
    if count and removed and string.match(count, '^%d+$') and string.match(removed, '^%d+$')
            and tonumber(removed) <= tonumber(count) then
        return tonumber(count), tonumber(removed)
    end
    local ids = redis.call('HMGET', rec_key, 'app', 'user', 'sid')
    error({err = CORRUPT .. ' the record of session ' .. shown(ids[1]) .. '/' .. shown(ids[2])
        .. '/' .. shown(ids[3]) .. ' is unreadable (a damaged event count)'})
end

local function read_record(key)
    local f = redis.call('HMGET', key, 'app', 'user', 'sid', 'n', 'c', 'u', 'k', 'l', 'r')
    if not f[4] then
        return false
    end
    return f
end

-- The revision marker of a record: number:count, and :removed after a truncation.
local function marker_of(number, count, removed)
    if removed > 0 then
        return number .. ':' .. count .. ':' .. removed
    end
    return number .. ':' .. count
end

-- The stored positions first..last (inclusive, by position), in order. Until a
-- truncation they are every position; after one, the positions set says.
local function positions(pos_key, removed, first, last)
    if first > last then
        return {}
    end
    if removed == 0 then
        local out = {}
        for s = first, last do
            out[#out + 1] = tostring(s)
        end
        return out
    end
    return redis.call('ZRANGE', pos_key, first, last, 'BYSCORE')
end

-- The last n stored positions (n nil: all), in order.
local function last_positions(pos_key, removed, count, n)
    if removed == 0 then
        local first = 0
        if n then
            first = math.max(0, count - n)
        end
        return positions(pos_key, 0, first, count - 1)
    end
    if n == 0 then
        return {}
    end
    return redis.call('ZRANGE', pos_key, n and -n or 0, -1)
end

local function hset_pairs(key, args, first, count)
    for i = first, first + 2 * count - 1, 2 do
        redis.call('HSET', key, args[i], args[i + 1])
    end
end

local function hset_blob(key, blob)
    -- Items framed by the client: (4-byte big-endian length, bytes) for a
    -- key, then for its value, and so on. (cmsgpack here reads no bin type.)
    local pos = 1
    while pos <= #blob do
        local klen = struct.unpack('>I4', blob, pos)
        local field = string.sub(blob, pos + 4, pos + 3 + klen)
        pos = pos + 4 + klen
        local vlen = struct.unpack('>I4', blob, pos)
        redis.call('HSET', key, field, string.sub(blob, pos + 4, pos + 3 + vlen))
        pos = pos + 4 + vlen
    end
end

-- The events of seqs first..last (inclusive), in order.
local function events_range(key, first, last)
    local out = {}
    local i = first
    while i <= last do
        local stop = math.min(last, i + CHUNK - 1)
        local fields = {}
        for s = i, stop do
            fields[#fields + 1] = tostring(s)
        end
        local got = redis.call('HMGET', key, unpack(fields))
        for _, v in ipairs(got) do
            out[#out + 1] = v
        end
        i = stop + 1
    end
    return out
end

local function events_of(key, seqs)
    local out = {}
    local i = 1
    while i <= #seqs do
        local fields = {}
        for j = i, math.min(#seqs, i + CHUNK - 1) do
            fields[#fields + 1] = seqs[j]
        end
        local got = redis.call('HMGET', key, unpack(fields))
        for _, v in ipairs(got) do
            out[#out + 1] = v
        end
        i = i + CHUNK
    end
    return out
end

-- A session's event times. While its record's `ts` field is set (every
-- event's time at or after the one before it), `t:` is a string holding the
-- time of the event at position i as an 8-byte big-endian double at byte
-- 8i, and a time is found by binary search over the positions (in this mode
-- a truncation removes the oldest positions, so the stored ones run from
-- the removed count to the last). Otherwise (a time went back, or a session
-- of store format 1) `t:` is the sorted set of positions scored by time.
-- The string costs one APPEND per session and call; the sorted set a ZADD
-- whose every insert parses the scores it passes.
local function time_at(tm_key, position)
    local raw = redis.call('GETRANGE', tm_key, 8 * position, 8 * position + 7)
    return (struct.unpack('>d', raw))
end

-- The first position in first..count-1 whose time is at or after t (count if none).
local function first_at_or_after(tm_key, first, count, t)
    local low, high = first, count
    while low < high do
        local mid = math.floor((low + high) / 2)
        if time_at(tm_key, mid) >= t then
            high = mid
        else
            low = mid + 1
        end
    end
    return low
end

-- Turns a session's time string into the sorted set (a time went back):
-- every stored position (removed..count-1) scored by its time.
local function times_to_set(rec_key, tm_key, removed, count)
    local raw = redis.call('GET', tm_key) or ''
    redis.call('DEL', tm_key)
    local batch = {}
    for position = removed, count - 1 do
        batch[#batch + 1] = struct.unpack('>d', raw, 8 * position + 1)
        batch[#batch + 1] = tostring(position)
        if #batch >= 2 * CHUNK then
            redis.call('ZADD', tm_key, unpack(batch))
            batch = {}
        end
    end
    if #batch > 0 then
        redis.call('ZADD', tm_key, unpack(batch))
    end
    redis.call('HDEL', rec_key, 'ts')
end

-- Record an app delta for a second step to apply (cluster). The token
-- starts with the user's own counter, so pending deltas sort in append order.
local function record_pending(pend_key, tail, blob)
    local order = redis.call('HINCRBY', pend_key, '#', 1)
    redis.call('HSET', pend_key, string.format('%016d', order) .. ':' .. tail, blob)
end

-- An app delta: written to the app's map where it shares the call's slot
-- (app_key given), recorded for the second step otherwise (cluster).
local function write_app_delta(app_key, pend_key, number, event_id, blob)
    if blob == '' then
        return
    end
    if app_key then
        hset_blob(app_key, blob)
    else
        record_pending(pend_key, number .. ':' .. event_id, blob)
    end
end

local function pending_of(pend_key)
    if redis.call('HLEN', pend_key) > 1 then
        return redis.call('HGETALL', pend_key)
    end
    return {}
end

local function expire_all(ttl, keys)
    if ttl > 0 then
        for _, k in ipairs(keys) do
            redis.call('EXPIRE', k, ttl)
        end
    end
end

-- How many stored events the caller's copy has, or nil when unknown
-- (the rules of events_seen in stores/rules.py).
local function events_seen(flags, marker, last_id, number, ids_key)
    if bit.band(flags, HAS_MARKER) ~= 0 then
        local colon = string.find(marker, ':', 1, true)
        if not colon then
            return nil
        end
        local rest = string.sub(marker, colon + 1)
        local count = string.match(rest, '^(%d+)$') or string.match(rest, '^(%d+):%d+$')
        if string.sub(marker, 1, colon - 1) ~= number or not count then
            return nil
        end
        return tonumber(count)
    end
    if bit.band(flags, HAS_LAST_ID) == 0 then
        return 0
    end
    local seq = redis.call('HGET', ids_key, last_id)
    if not seq then
        return nil
    end
    return tonumber(seq) + 1
end

-- KEYS: record, events, times, state, positions, user state, pending[, app state]
-- ARGV: last n ('' for all), after timestamp ('' for none)
-- Returns false for no session, or the name of a part of the session that is
-- gone while others remain (a server that evicts keys drops them one by one;
-- a delete or an expiry removes them together), or the session. A record
-- with `sm` set names a state map (a session created or restored with state).
local function load(keys, args)
    local rec_key, ev_key, tm_key, st_key, pos_key = keys[1], keys[2], keys[3], keys[4], keys[5]
    local ust_key, pend_key, app_key = keys[6], keys[7], keys[8]
    -- The record as read_record reads it, and whether it names a state map.
    local rec = redis.call('HMGET', rec_key, 'app', 'user', 'sid', 'n', 'c', 'u', 'k', 'l', 'r',
        'sm')
    if not rec[4] then
        if redis.call('EXISTS', ev_key, tm_key, st_key) > 0 then
            return 'record'
        end
        return false
    end
    local names_state = rec[10]
    rec[10] = nil
    local count, removed = counts_of(rec_key, rec[7], rec[9])
    local n = nil
    if args[1] ~= '' then
        n = tonumber(args[1])
    end
    if args[2] ~= '' and count > removed and redis.call('EXISTS', tm_key) == 0 then
        -- A time filter reads the event times: without them it would select nothing.
        return 'event times'
    end
    local seqs
    local ordered = args[2] ~= '' and redis.call('HEXISTS', rec_key, 'ts') == 1
    if ordered then
        -- Times in position order: the events from the first at or after
        -- the time to the last (and the last n of those), by binary search.
        local first = first_at_or_after(tm_key, removed, count, tonumber(args[2]))
        if n then
            first = math.max(first, count - n)
        end
        seqs = positions(pos_key, 0, first, count - 1)
    elseif args[2] ~= '' and not n then
        -- Only the events at or after the time are read.
        seqs = redis.call('ZRANGE', tm_key, args[2], '+inf', 'BYSCORE')
        table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
    else
        seqs = last_positions(pos_key, removed, count, n)
        if args[2] ~= '' and #seqs > 0 then
            -- The last n first, then the filter: only their times are read.
            local after = tonumber(args[2])
            local scores = redis.call('ZMSCORE', tm_key, unpack(seqs))
            local kept = {}
            for i, score in ipairs(scores) do
                if score and tonumber(score) >= after then
                    kept[#kept + 1] = seqs[i]
                end
            end
            seqs = kept
        end
    end
    local state = redis.call('HGETALL', st_key)
    if names_state and #state == 0 then
        return 'state'
    end
    local pending = {}
    if not app_key then
        pending = pending_of(pend_key)
    end
    return {rec, events_of(ev_key, seqs), state,
        redis.call('HGETALL', ust_key), app_key and redis.call('HGETALL', app_key) or false,
        pending}
end

-- Writes are gathered per key and issued together (one HSET or ZADD per key
-- and call) when the call ends or before anything reads them back: a bulk
-- call that interleaves sessions pays a few calls per session, not per event.
local function put(command, key, list)
    for i = 1, #list, 2 * CHUNK do
        redis.call(command, key, unpack(list, i, math.min(#list, i + 2 * CHUNK - 1)))
    end
end

local function new_writes()
    return {ev = {}, ids = {}, tm = {}, times = {}, names = {}, pos = {}, st = {}}
end

-- One session of an append call: its keys (record, events, ids, times,
-- state, positions, names, user state, index, pending, counter[, app
-- state]), its record as the call changes it, and its writes not yet issued.
local function open_session(keys, sid)
    return {keys = keys, sid = sid, ids = {}, stored_seq = {}, new_at = {},
        w = new_writes(), wrote = false}
end

-- Reads a session's record and the stored seq of every event id the call
-- names for it: two calls however many requests the call has for it.
local function read_session(s)
    local head = redis.call('HMGET', s.keys[1], 'n', 'u', 'k', 'l', 'r', 'ts')
    s.number, s.updated, s.last, s.removed = head[1], head[2], head[4], 0
    if not s.number then
        return
    end
    s.count, s.removed = counts_of(s.keys[1], head[3], head[5])
    -- In order: the time string is kept, and the last time bounds the next.
    s.ordered, s.last_time = head[6] and true or false, nil
    if s.ordered and s.count > 0 then
        s.last_time = time_at(s.keys[4], s.count - 1)
    end
    local ids, total = s.ids, #s.ids
    for i = 1, total, CHUNK do
        local part = redis.call('HMGET', s.keys[3], unpack(ids, i, math.min(total, i + CHUNK - 1)))
        for j = 1, #part do
            if part[j] then
                s.stored_seq[ids[i + j - 1]] = part[j]
            end
        end
    end
end

-- Issues every gathered write of the call: the sessions' keys, then the
-- user maps (each map's items in request order, so the latest value wins).
-- Writes a session's record after a call's appends to it; a session given
-- state names its state map there (see load).
local function put_record(s)
    if s.names_state then
        redis.call('HSET', s.keys[1], 'u', s.updated, 'k', tostring(s.count), 'l', s.last,
            'sm', '1')
    else
        redis.call('HSET', s.keys[1], 'u', s.updated, 'k', tostring(s.count), 'l', s.last)
    end
end

local function flush_session(s)
    local w, keys = s.w, s.keys
    if #w.ev == 0 and #w.st == 0 then
        return
    end
    put('HSET', keys[2], w.ev)
    put('HSET', keys[3], w.ids)
    if #w.times > 0 then
        redis.call('APPEND', keys[4], table.concat(w.times))
    end
    put('ZADD', keys[4], w.tm)
    put('HSET', keys[5], w.st)
    put('HSET', keys[7], w.names)
    put('ZADD', keys[6], w.pos)
    s.w = new_writes()
end

local function flush_user_items(call)
    for _, key in ipairs(call.user_keys) do
        put('HSET', key, call.user_items[key])
        call.user_items[key] = {}
    end
end

local function flush_call(call)
    for _, s in ipairs(call.sessions) do
        flush_session(s)
    end
    flush_user_items(call)
end

local function user_items(call, key)
    local list = call.user_items[key]
    if not list then
        list = {}
        call.user_items[key] = list
        call.user_keys[#call.user_keys + 1] = key
    end
    return list
end

-- Listing index entries an append call touches, written by one ZADD per
-- index at the call's end (the latest time of each session).
local function new_index()
    return {keys = {}, scores = {}, order = {}}
end

local function note_index(index, key, score, member)
    local scores = index.scores[key]
    if not scores then
        scores = {}
        index.scores[key] = scores
        index.keys[#index.keys + 1] = key
        index.order[key] = {}
    end
    if not scores[member] then
        local order = index.order[key]
        order[#order + 1] = member
    end
    scores[member] = score
end

local function flush_index(index, ttl)
    for _, key in ipairs(index.keys) do
        local scores, list = index.scores[key], {}
        for _, member in ipairs(index.order[key]) do
            list[#list + 1] = scores[member]
            list[#list + 1] = member
        end
        put('ZADD', key, list)
        if ttl > 0 then
            redis.call('EXPIRE', key, ttl)
        end
    end
end

-- An append request's arguments start at args[pos]: event id, timestamp,
-- event, flags; then, with CALLER, the caller's marker, time and last event
-- id; then, with ITEMS, the session item count, the user item count and the
-- app items blob, or else, with APP, the app items blob alone; then the item
-- pairs. Without ITEMS the item counts ride in the flags, from COUNTED up:
-- sessions + 65536 * users (each under 65536). A locked bulk request without
-- state is the first four arguments alone: every argument costs a Lua string.
-- Returns its flags, where the caller's fields start (nil: none), the item
-- counts, the app blob, where the pairs start, and where the next request starts.
local function request_parts(args, pos)
    if args[pos + 3] == PLAIN_LOCKED then
        -- The common bulk request: nothing follows its four arguments.
        return LOCKED, nil, 0, 0, '', pos + 4, pos + 4
    end
    local flags = tonumber(args[pos + 3])
    local p, caller = pos + 4, nil
    if bit.band(flags, CALLER) ~= 0 then
        caller, p = p, p + 3
    end
    local n_session, n_user, blob = 0, 0, ''
    if bit.band(flags, ITEMS) ~= 0 then
        n_session, n_user, blob = tonumber(args[p]), tonumber(args[p + 1]), args[p + 2]
        p = p + 3
    else
        if flags >= COUNTED then
            local counts = math.floor(flags / COUNTED)
            n_session, n_user = counts % 65536, math.floor(counts / 65536)
        end
        if bit.band(flags, APP) ~= 0 then
            blob, p = args[p], p + 1
        end
    end
    return flags, caller, n_session, n_user, blob, p, p + 2 * (n_session + n_user)
end

-- Where the request after the one at args[pos] starts.
local function request_end(args, pos)
    if args[pos + 3] == PLAIN_LOCKED then
        return pos + 4
    end
    local _, _, _, _, _, _, after = request_parts(args, pos)
    return after
end

local function push_pairs(list, args, first, n)
    local len = #list
    for i = 0, 2 * n - 1 do
        list[len + 1 + i] = args[first + i]
    end
end

-- Tries one request on session s; its arguments start at args[pos] (see
-- request_parts). Returns the result and where the next request starts. An accepted append
-- without catch-up is the session's event count after it (the client builds
-- the marker from it, and the time is the one it sent); the other results
-- are tables: {'dup', position}, {'no', record, stored event, position} or
-- a catch-up's (position: the stored event's, false for none or one of this call).
local function append_one(call, s, args, pos)
    -- Keys (see open_session) are looked up where a path needs them: most
    -- requests take none of those paths.
    local keys = s.keys
    local event_id, ts, event = args[pos], args[pos + 1], args[pos + 2]
    local flags, caller, n_session, n_user, app_blob, items, after = request_parts(args, pos)
    local number = s.number
    local refusal = nil
    if not number then
        return {'no', false, false}, after
    end
    -- An id this call already appended: its event is still among the arguments.
    local found, stored, seq = false, false, false
    local at = s.new_at[event_id]
    if at then
        found, stored = true, args[at]
    else
        seq = s.stored_seq[event_id] or false
        if seq then
            found, stored = true, redis.call('HGET', keys[2], seq)
        end
    end
    if found then
        -- With the stored event's position (false for one of this call): the
        -- client tells a retry after a lost reply (see check_append).
        if stored == event then
            return {'dup', seq}, after
        end
        refusal = {'no', false, stored, seq}
    elseif bit.band(flags, LOCKED) == 0 then
        if bit.band(flags, HAS_MARKER) ~= 0 then
            if args[caller] ~= marker_of(number, s.count, s.removed) then
                refusal = {'no', false, false}
            end
        else
            -- A copy built by hand: stale only if the store is newer
            -- and its last event is not the copy's last event.
            local last_id = bit.band(flags, HAS_LAST_ID) ~= 0 and args[caller + 2] or false
            if tonumber(s.updated) > tonumber(args[caller + 1]) and s.last ~= last_id then
                refusal = {'no', false, false}
            end
        end
    end
    if refusal then
        local rec = read_record(keys[1])
        rec[6], rec[7], rec[8], rec[9] = s.updated, tostring(s.count), s.last, tostring(s.removed)
        refusal[2] = rec
        return refusal, after
    end
    local known = nil
    local catch_up = bit.band(flags, CATCH_UP) ~= 0
    if catch_up then
        flush_call(call)
        known = events_seen(flags, args[caller], args[caller + 2], number, keys[3])
    end
    local before = s.count
    local w = s.w
    if n_session > 0 then
        push_pairs(w.st, args, items, n_session)
        s.names_state = true
    end
    if n_user > 0 then
        push_pairs(user_items(call, keys[8]), args, items + 2 * n_session, n_user)
    end
    if app_blob ~= '' then
        write_app_delta(keys[12], keys[10], number, event_id, app_blob)
    end
    local field = tostring(s.count)
    if s.ordered then
        local time = tonumber(ts)
        if s.last_time and time < s.last_time then
            -- A time went back: from now on the session keeps the sorted set.
            flush_session(s)
            times_to_set(keys[1], keys[4], s.removed, s.count)
            s.ordered = false
            w = s.w
        else
            local times = w.times
            times[#times + 1] = struct.pack('>d', time)
            s.last_time = time
        end
    end
    local ev, ids, names = w.ev, w.ids, w.names
    local n = #ev
    ev[n + 1], ev[n + 2] = field, event
    ids[n + 1], ids[n + 2] = event_id, field
    if not s.ordered then
        local tm = w.tm
        tm[#tm + 1], tm[#tm + 2] = ts, field
    end
    names[n + 1], names[n + 2] = field, event_id
    if s.removed > 0 then
        local p = w.pos
        p[#p + 1], p[#p + 2] = field, field
    end
    s.new_at[event_id] = pos + 2
    s.count, s.updated, s.last, s.wrote = s.count + 1, ts, event_id, true
    if not catch_up then
        return s.count, after
    end
    flush_call(call)
    local replace = 0
    if known == nil then
        known, replace = 0, 1
    end
    return {'ok', marker_of(number, s.count, s.removed), s.count, ts, replace,
        events_of(keys[2], positions(keys[6], s.removed, known, before - 1)),
        redis.call('HGETALL', keys[5]), redis.call('HGETALL', keys[8]),
        keys[12] and redis.call('HGETALL', keys[12]) or false,
        redis.call('HGET', keys[1], 'c'), known}, after
end

-- The common accepted append of one session, in straight code: one
-- request (the session exists, the copy is current or the append locked,
-- the event id is new, no catch-up), or a run of locked requests without
-- catch-up (a bulk append of one session) whose ids are all new. Returns
-- nil, having written nothing, for anything else: the general path then
-- decides it (a repeat, a refusal, a catch-up). Lua's own work, tables above
-- all, costs more in a function than the Redis calls, hence this path.
-- Arguments as for append, with one session and one run of `total`.
local function append_straight(keys, args, ttl, total)
    local starts, pos = {}, 9
    for i = 1, total do
        local flags = tonumber(args[pos + 3])
        if bit.band(flags, CATCH_UP) ~= 0 or (total > 1 and bit.band(flags, LOCKED) == 0) then
            return nil
        end
        starts[i] = pos
        pos = request_end(args, pos)
    end
    local rec_key, ids_key = keys[2], keys[4]
    local head = redis.call('HMGET', rec_key, 'n', 'u', 'k', 'l', 'r', 'ts')
    local number = head[1]
    if not number then
        return nil
    end
    local count, removed = counts_of(rec_key, head[3], head[5])
    local ordered, times = head[6] and true or false, nil
    if ordered then
        local last = count > 0 and time_at(keys[5], count - 1) or nil
        times = {}
        for i = 1, total do
            local time = tonumber(args[starts[i] + 1])
            if last and time < last then
                -- A time goes back: the general path turns the times into the set.
                return nil
            end
            times[i], last = struct.pack('>d', time), time
        end
    end
    if total == 1 then
        local flags = tonumber(args[12])
        if bit.band(flags, LOCKED) == 0 then
            if bit.band(flags, HAS_MARKER) ~= 0 then
                if args[13] ~= marker_of(number, count, removed) then
                    return nil
                end
            else
                local caller = bit.band(flags, HAS_LAST_ID) ~= 0 and args[15] or false
                if tonumber(head[2]) > tonumber(args[14]) and head[4] ~= caller then
                    return nil
                end
            end
        end
        -- The id index entry goes first: it is also the check that the id is new.
        if redis.call('HSETNX', ids_key, args[9], tostring(count)) == 0 then
            return nil
        end
    else
        local ids, seen = {}, {}
        for i = 1, total do
            local id = args[starts[i]]
            if seen[id] then
                return nil
            end
            seen[id], ids[i] = true, id
        end
        local stored = redis.call('HMGET', ids_key, unpack(ids))
        for i = 1, total do
            if stored[i] then
                return nil
            end
        end
    end
    local ev, id_pairs, tm, names, kept, st, ust = {}, {}, {}, {}, {}, {}, {}
    local app_key, pend_key = keys[13], keys[11]
    local results, event_id, ts = {}, nil, nil
    for i = 1, total do
        local p = starts[i]
        local _, _, n_session, n_user, app_blob, items = request_parts(args, p)
        local field = tostring(count)
        event_id, ts = args[p], args[p + 1]
        local n = #ev
        ev[n + 1], ev[n + 2] = field, args[p + 2]
        id_pairs[n + 1], id_pairs[n + 2] = event_id, field
        if not ordered then
            tm[n + 1], tm[n + 2] = ts, field
        end
        names[n + 1], names[n + 2] = field, event_id
        if removed > 0 then
            kept[n + 1], kept[n + 2] = field, field
        end
        push_pairs(st, args, items, n_session)
        push_pairs(ust, args, items + 2 * n_session, n_user)
        write_app_delta(app_key, pend_key, number, event_id, app_blob)
        count = count + 1
        results[i] = count
    end
    put('HSET', keys[3], ev)
    if total > 1 then
        put('HSET', ids_key, id_pairs)
    end
    if ordered then
        redis.call('APPEND', keys[5], table.concat(times))
    else
        put('ZADD', keys[5], tm)
    end
    put('HSET', keys[8], names)
    put('ZADD', keys[7], kept)
    put('HSET', keys[6], st)
    put('HSET', keys[9], ust)
    if #st > 0 then
        -- The record names the state map it now has: a read that finds it gone
        -- reports the session corrupt (see load).
        redis.call('HSET', rec_key, 'u', ts, 'k', tostring(count), 'l', event_id, 'sm', '1')
    else
        redis.call('HSET', rec_key, 'u', ts, 'k', tostring(count), 'l', event_id)
    end
    redis.call('ZADD', keys[10], ts, args[6])
    if ttl > 0 then
        expire_all(ttl, {rec_key, keys[3], ids_key, keys[5], keys[6], keys[7], keys[8], keys[9],
            keys[10], pend_key, keys[12]})
    end
    local pending = {}
    if not app_key then
        pending = pending_of(pend_key)
    end
    return {{{results, number, removed}}, pending}
end

-- A read placed between a call's runs answers as load would after the runs
-- before it: the session's gathered writes, the user maps' and its record
-- are issued first (the app map is written as the call goes).
local function read_in_call(call, s, n, after)
    flush_session(s)
    flush_user_items(call)
    local k = s.keys
    if s.wrote then
        put_record(s)
    end
    return load({k[1], k[2], k[4], k[5], k[6], k[8], k[10], k[12]}, {n, after})
end

-- The calls of a batch are chained by the batch's guard, a hash kept a
-- minute: `n` counts the calls that ran, in order (negated once one was
-- refused part-way), and field k holds call k's reply. Call k runs only
-- while `n` is k: after a call that was refused, or that the server never
-- ran (out of memory, the library flushed), the calls after it append
-- nothing, so what a batch stores is always a prefix of it. A call sent
-- again after it ran (a pipeline resent after a lost connection) answers
-- its first reply and appends nothing; the answers of reads placed in it
-- are not kept (they can be large), only the word 'lost' in their place.
local GUARD_SECONDS = 60

-- The pending app deltas of a call's user (cluster: no app map among the
-- keys of its first session, which start at keys[2]).
local function call_pending(keys, per)
    if per < 12 then
        return pending_of(keys[11])
    end
    return {}
end

-- Notes in the guard that call `place` ran and what it answered; a call
-- stopped by a refusal does not let the calls after it run.
local function note_call(guard_key, place, kept, stopped)
    local ran = tonumber(place) + 1
    redis.call('HSET', guard_key, place, cmsgpack.pack(kept), 'n', stopped and -ran or ran)
    redis.call('EXPIRE', guard_key, GUARD_SECONDS)
end

-- KEYS: the batch's guard, then per session of the call: record, events,
--       ids, times, state, positions, names, user state, index, pending,
--       counter[, app state]
-- ARGV: the call's place in its batch (0, 1, ...; '' for an append outside
--   a batch), ttl, session count, keys per session, run
--   count, each session's id, then per run: its session (1-based), request
--   count and the requests (see append_one); or, for a read placed there,
--   its session, -1, and load's two arguments (last n, after timestamp).
-- A run is consecutive requests of one session; a bulk call that
-- interleaves sessions has many runs and reads each session once. Every
-- session of a call shares a slot on a cluster (one user's). Returns {runs,
-- pending}: per run tried, {results, session number, truncated count}, or a
-- read's answer as load gives it (a refusal ends the call, and in a batch
-- holds the calls after it back), and the pending app deltas of the call's
-- user (cluster mode) for the client to finish. A call of a batch whose
-- predecessor has not landed runs nothing and returns {false, {}}.
local function append(keys, args)
    local guard_key, place, ttl = keys[1], args[1], tonumber(args[2])
    local n_sessions, per, n_runs = tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
    local out = {}
    if place ~= '' then
        local ran, k = tonumber(redis.call('HGET', guard_key, 'n') or '0'), tonumber(place)
        if k < math.abs(ran) then
            -- This call ran already: its answer again.
            local kept = redis.call('HGET', guard_key, place)
            return {cmsgpack.unpack(kept), call_pending(keys, per)}
        end
        if ran ~= k then
            -- The call before it in the batch did not land: nothing is tried.
            return {false, {}}
        end
    end
    if n_sessions == 1 and n_runs == 1 and tonumber(args[8]) > 0 then
        local reply = append_straight(keys, args, ttl, tonumber(args[8]))
        if reply then
            if place ~= '' then
                note_call(guard_key, place, reply[1], false)
            end
            return reply
        end
    end
    local call = {sessions = {}, user_items = {}, user_keys = {}}
    for i = 1, n_sessions do
        local session_keys, k = {}, 1 + (i - 1) * per
        for j = 1, per do
            session_keys[j] = keys[k + j]
        end
        call.sessions[i] = open_session(session_keys, args[5 + i])
    end
    -- The event ids of each session's requests, read in one HMGET per session.
    local first_run = 6 + n_sessions
    local pos = first_run
    for _ = 1, n_runs do
        local s, total = call.sessions[tonumber(args[pos])], tonumber(args[pos + 1])
        pos = pos + 2
        if total < 0 then
            pos = pos + 2
        end
        for _ = 1, total do
            s.ids[#s.ids + 1] = args[pos]
            pos = request_end(args, pos)
        end
    end
    for _, s in ipairs(call.sessions) do
        read_session(s)
    end
    pos = first_run
    -- The reply as the guard keeps it (reads' answers left out), and
    -- whether a refusal stopped the call.
    local kept, stopped = {}, false
    for r = 1, n_runs do
        local s, total = call.sessions[tonumber(args[pos])], tonumber(args[pos + 1])
        pos = pos + 2
        local results, refused = {}, false
        if total < 0 then
            results = read_in_call(call, s, args[pos], args[pos + 1])
            pos = pos + 2
        end
        for i = 1, total do
            results[i], pos = append_one(call, s, args, pos)
            if type(results[i]) == 'table' and results[i][1] == 'no' then
                refused = true
                break
            end
        end
        if total < 0 then
            out[r], kept[r] = results, 'lost'
        else
            out[r] = {results, s.number or false, s.removed}
            kept[r] = out[r]
        end
        if refused then
            stopped = true
            break
        end
    end
    flush_call(call)
    local index = new_index()
    for _, s in ipairs(call.sessions) do
        if s.wrote then
            local k = s.keys
            put_record(s)
            note_index(index, k[9], s.updated, s.sid)
            expire_all(ttl, {k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[10], k[11]})
        end
    end
    flush_index(index, ttl)
    if place ~= '' then
        note_call(guard_key, place, kept, stopped)
    end
    return {out, call_pending(keys, per)}
end

-- A new session number: microseconds of server time, above every number
-- this user's counter has handed out, so a session created later under an id
-- always has a greater number than the one before it.
local function new_number(counter_key)
    local now = redis.call('TIME')
    local number = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local last = tonumber(redis.call('GET', counter_key) or '0')
    if number <= last then
        number = last + 1
    end
    redis.call('SET', counter_key, string.format('%d', number))
    return string.format('%d', number)
end

-- KEYS: record, state, user state, index, pending, counter[, app state]
-- ARGV: app, user, sid, token, create time, ttl, session item count,
--       user item count, app items blob, times layout ('1': the time
--       string while in order; '0': the sorted set, store format 1), item pairs.
-- Returns false when the id is taken by another session; a repeat of this
-- very create (same token: a retry after a lost reply) answers as the first.
local function create(keys, args)
    local rec_key, st_key, ust_key, idx_key, pend_key = keys[1], keys[2], keys[3], keys[4], keys[5]
    local counter_key, app_key = keys[6], keys[7]
    local token, ttl = args[4], tonumber(args[6])
    local n_session, n_user, app_blob = tonumber(args[7]), tonumber(args[8]), args[9]
    local rec = read_record(rec_key)
    if rec and redis.call('HGET', rec_key, 'tk') ~= token then
        return false
    end
    if not rec then
        local number = new_number(counter_key)
        redis.call('HSET', rec_key, 'app', args[1], 'user', args[2], 'sid', args[3],
            'n', number, 'c', args[5], 'u', args[5], 'k', '0', 'tk', token)
        if args[10] == '1' then
            redis.call('HSET', rec_key, 'ts', '1')
        end
        if n_session > 0 then
            -- The record names its state map: a read finds it gone (see load).
            redis.call('HSET', rec_key, 'sm', '1')
        end
        hset_pairs(st_key, args, 11, n_session)
        hset_pairs(ust_key, args, 11 + 2 * n_session, n_user)
        write_app_delta(app_key, pend_key, number, '', app_blob)
        redis.call('ZADD', idx_key, args[5], args[3])
        expire_all(ttl, {rec_key, st_key, ust_key, idx_key, pend_key, counter_key})
        rec = read_record(rec_key)
    end
    local pending = {}
    if not app_key then
        pending = pending_of(pend_key)
    end
    return {rec, redis.call('HGETALL', st_key), redis.call('HGETALL', ust_key),
        app_key and redis.call('HGETALL', app_key) or false, pending}
end

-- KEYS: record, events, ids, times, state, positions, names, index.
-- ARGV: sid[, idle before]. With a time, deletes only a session last updated
-- before it (an expiry that an append overtook leaves the session whole).
local function delete(keys, args)
    local updated = redis.call('HGET', keys[1], 'u')
    if not updated then
        if not args[2] then
            -- What is left of a session whose record is gone (evicted) goes too.
            redis.call('DEL', keys[2], keys[3], keys[4], keys[5], keys[6], keys[7])
            redis.call('ZREM', keys[8], args[1])
        end
        return 0
    end
    if args[2] and tonumber(updated) >= tonumber(args[2]) then
        return 0
    end
    redis.call('DEL', keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7])
    redis.call('ZREM', keys[8], args[1])
    return 1
end

-- The first removal of a session's events: from now on the positions set
-- (every position 0..count-1 to begin with) says which stay.
local function index_positions(pos_key, count)
    local all = {}
    for s = 0, count - 1 do
        all[#all + 1] = s
        all[#all + 1] = tostring(s)
        if #all >= 2 * CHUNK then
            redis.call('ZADD', pos_key, unpack(all))
            all = {}
        end
    end
    if #all > 0 then
        redis.call('ZADD', pos_key, unpack(all))
    end
end

-- KEYS: record, events, ids, times, positions, names.
-- ARGV: 'before' and a time, or 'keep' and a count; the most to remove now.
-- Removes the oldest matching events (up to the most) and returns how many;
-- the client calls again until none is left. The session stays readable.
local function truncate(keys, args)
    local rec_key, ev_key, ids_key, tm_key, pos_key, names_key = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
    local rec = read_record(rec_key)
    if not rec then
        return -1
    end
    local count, removed = counts_of(rec_key, rec[7], rec[9])
    local most = tonumber(args[3])
    local doomed
    local ordered = redis.call('HEXISTS', rec_key, 'ts') == 1
    if args[1] == 'before' and ordered then
        -- Times in position order: the oldest positions, up to the first at
        -- or after the time. (Their bytes stay in the string: positions index it.)
        local stop = first_at_or_after(tm_key, removed, count, tonumber(args[2]))
        doomed = positions(pos_key, 0, removed, math.min(stop, removed + most) - 1)
    elseif args[1] == 'before' then
        doomed = redis.call('ZRANGE', tm_key, '-inf', '(' .. args[2], 'BYSCORE', 'LIMIT', 0, most)
    else
        local stored = count - removed
        local surplus = math.min(most, stored - tonumber(args[2]))
        if surplus <= 0 then
            return 0
        end
        doomed = last_positions(pos_key, removed, count, nil)
        for i = surplus + 1, #doomed do
            doomed[i] = nil
        end
    end
    if #doomed == 0 then
        return 0
    end
    if removed == 0 then
        index_positions(pos_key, count)
    end
    local names = redis.call('HMGET', names_key, unpack(doomed))
    for i, seq in ipairs(doomed) do
        if names[i] then
            redis.call('HDEL', ids_key, names[i])
        end
    end
    redis.call('HDEL', ev_key, unpack(doomed))
    redis.call('HDEL', names_key, unpack(doomed))
    if not ordered then
        redis.call('ZREM', tm_key, unpack(doomed))
    end
    redis.call('ZREM', pos_key, unpack(doomed))
    redis.call('HSET', rec_key, 'r', tostring(removed + #doomed))
    return #doomed
end

-- KEYS: record, events, ids, times, positions, names.
-- ARGV: how many events to remove, the call's token[, the id the newest
--   stored event must have].
-- Removes the newest stored events (as a truncation removes the oldest:
-- removed count up, positions never reused) and returns their records,
-- oldest first; false when the session does not exist. With an id, the
-- pop happens only if the newest stored event has it: otherwise (or when
-- none is stored) nothing is written and the reply is 0. A session whose
-- times were a string in position order gets the sorted set first: its
-- stored positions no longer run from the removed count to the last.
-- The record keeps the last call's token and reply ('pt', 'pr'): the same
-- call sent again after a lost reply answers as the first, removing nothing.
local function pop(keys, args)
    local rec_key, ev_key, ids_key, tm_key, pos_key, names_key = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
    local rec = read_record(rec_key)
    if not rec then
        return false
    end
    local done = redis.call('HMGET', rec_key, 'pt', 'pr')
    if done[1] == args[2] then
        return cmsgpack.unpack(done[2])
    end
    local count, removed = counts_of(rec_key, rec[7], rec[9])
    local most = tonumber(args[1])
    if args[3] then
        -- The newest stored position: the last one until something was removed.
        local newest = count > removed and tostring(count - 1) or nil
        if newest and removed > 0 then
            newest = redis.call('ZRANGE', pos_key, -1, -1)[1]
        end
        if not newest or redis.call('HGET', ids_key, args[3]) ~= newest then
            return 0
        end
    end
    if count - removed == 0 or most <= 0 then
        redis.call('HDEL', rec_key, 'pt', 'pr')
        return {}
    end
    if redis.call('HEXISTS', rec_key, 'ts') == 1 then
        times_to_set(rec_key, tm_key, removed, count)
    end
    if removed == 0 then
        index_positions(pos_key, count)
    end
    local doomed = redis.call('ZRANGE', pos_key, -most, -1)
    local records = events_of(ev_key, doomed)
    local names = events_of(names_key, doomed)
    for i = 1, #doomed do
        if names[i] then
            redis.call('HDEL', ids_key, names[i])
        end
    end
    -- In slices, well under Lua's limit on unpacked arguments.
    for first = 1, #doomed, CHUNK do
        local slice = {unpack(doomed, first, math.min(#doomed, first + CHUNK - 1))}
        redis.call('HDEL', ev_key, unpack(slice))
        redis.call('HDEL', names_key, unpack(slice))
        redis.call('ZREM', tm_key, unpack(slice))
        redis.call('ZREM', pos_key, unpack(slice))
    end
    redis.call('HSET', rec_key, 'r', tostring(removed + #doomed))
    local last = redis.call('ZRANGE', pos_key, -1, -1)
    local last_id = last[1] and redis.call('HGET', names_key, last[1])
    if last_id then
        redis.call('HSET', rec_key, 'l', last_id)
    else
        redis.call('HDEL', rec_key, 'l')
    end
    redis.call('HSET', rec_key, 'pt', args[2], 'pr', cmsgpack.pack(records))
    return records
end

-- KEYS: record, events, ids, times, state, names, index, counter
-- ARGV: app, user, sid, create time, last update time, last event id ('' none),
--       ttl, state item count, event count, times layout (as for create),
--       state pairs, then per event: id, timestamp, record.
-- Writes a whole session as given; false when the id is taken.
local function restore(keys, args)
    local rec_key, ev_key, ids_key, tm_key, st_key = keys[1], keys[2], keys[3], keys[4], keys[5]
    local names_key, idx_key, counter_key = keys[6], keys[7], keys[8]
    if redis.call('EXISTS', rec_key) == 1 then
        return false
    end
    local n_state, n_events = tonumber(args[8]), tonumber(args[9])
    local number = new_number(counter_key)
    local fields = {'app', args[1], 'user', args[2], 'sid', args[3], 'n', number, 'c', args[4],
        'u', args[5], 'k', tostring(n_events), 'tk', ''}
    if args[6] ~= '' then
        fields[#fields + 1], fields[#fields + 2] = 'l', args[6]
    end
    if n_state > 0 then
        fields[#fields + 1], fields[#fields + 2] = 'sm', '1'
    end
    hset_pairs(st_key, args, 11, n_state)
    local first = 11 + 2 * n_state
    -- The time string when the store keeps one and the times never go back.
    local times = nil
    if args[10] == '1' then
        times = {}
        local last = nil
        for i = 0, n_events - 1 do
            local time = tonumber(args[first + 3 * i + 1])
            if last and time < last then
                times = nil
                break
            end
            times[i + 1], last = struct.pack('>d', time), time
        end
    end
    if times then
        fields[#fields + 1], fields[#fields + 2] = 'ts', '1'
        if n_events > 0 then
            redis.call('SET', tm_key, table.concat(times))
        end
    end
    redis.call('HSET', rec_key, unpack(fields))
    local pos = first
    for seq = 0, n_events - 1 do
        local field = tostring(seq)
        redis.call('HSET', ev_key, field, args[pos + 2])
        redis.call('HSET', ids_key, args[pos], field)
        redis.call('HSET', names_key, field, args[pos])
        if not times then
            redis.call('ZADD', tm_key, args[pos + 1], field)
        end
        pos = pos + 3
    end
    redis.call('ZADD', idx_key, args[5], args[3])
    expire_all(tonumber(args[7]), {rec_key, ev_key, ids_key, tm_key, st_key, names_key, idx_key,
        counter_key})
    return true
end

-- KEYS: app state, applied tokens. ARGV: ttl, then token, blob, token, blob, ...
-- Applies each pending app delta once: a token already applied is skipped.
local function apply(keys, args)
    local now = tonumber(redis.call('TIME')[1])
    redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', now - APPLIED_HORIZON)
    local applied = 0
    for i = 2, #args, 2 do
        if not redis.call('ZSCORE', keys[2], args[i]) then
            hset_blob(keys[1], args[i + 1])
            redis.call('ZADD', keys[2], now, args[i])
            applied = applied + 1
        end
    end
    local ttl = tonumber(args[1])
    if ttl > 0 and redis.call('TTL', keys[1]) == -1 then
        -- A map this call created lives as the client's upkeep would have set it.
        redis.call('EXPIRE', keys[1], 2 * ttl)
    end
    return applied
end

-- KEYS: pending. ARGV: tokens applied.
local function clear(keys, args)
    return redis.call('HDEL', keys[1], unpack(args))
end

-- KEYS: app directory. ARGV: user, score read. Removes the user only if no
-- create touched the entry since it was read.
local function prune(keys, args)
    if redis.call('ZSCORE', keys[1], args[1]) == args[2] then
        return redis.call('ZREM', keys[1], args[1])
    end
    return 0
end

-- Does nothing: the round trip of an FCALL, for benchmarks.
local function noop(keys, args)
    return 1
end

redis.register_function('sessionscope_8_append', append)
redis.register_function('sessionscope_8_create', create)
redis.register_function{function_name = 'sessionscope_8_load', callback = load, flags = {'no-writes'}}
redis.register_function('sessionscope_8_delete', delete)
redis.register_function('sessionscope_8_truncate', truncate)
redis.register_function('sessionscope_8_pop', pop)
redis.register_function('sessionscope_8_restore', restore)
redis.register_function('sessionscope_8_apply', apply)
redis.register_function('sessionscope_8_clear', clear)
redis.register_function('sessionscope_8_prune', prune)
redis.register_function{function_name = 'sessionscope_8_noop', callback = noop, flags = {'no-writes'}}
