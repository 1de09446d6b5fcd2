-- wrk script for bench/load.py (which fills in the requests and the seed): a weighted random mix of
-- pre-formatted requests; counts statuses; prints one RESULT line for load.py to read.
local requests = {
-- REQUESTS --
}
local formatted, cumulative, total = {}, {}, 0
statuses = {}                           -- global: done() reads it through thread:get
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(-- SEED --)
  for i, r in ipairs(requests) do
    local headers = {}
    if r[4] then headers["Content-Type"] = "application/json" end
    if r[5] then headers["Accept"] = r[5] end
    formatted[i] = wrk.format(r[2], r[3], headers, r[4])
    total = total + r[1]
    cumulative[i] = total
  end
end

function request()
  local x = math.random() * total
  local lo, hi = 1, #cumulative
  while lo < hi do                      -- first index whose cumulative weight exceeds x
    local mid = math.floor((lo + hi) / 2)
    if cumulative[mid] > x then hi = mid else lo = mid + 1 end
  end
  return formatted[lo]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do counts[status] = (counts[status] or 0) + n end
  end
  local non2xx, s503, s5xx, s304 = 0, 0, 0, 0
  for status, n in pairs(counts) do
    if status == 503 then s503 = s503 + n
    elseif status < 200 or status > 299 then non2xx = non2xx + n end
    if status >= 500 and status ~= 503 then s5xx = s5xx + n end
    if status == 304 then s304 = s304 + n end
  end
  local e = summary.errors
  local socket = e.connect + e.read + e.write + e.timeout
  io.write(string.format(
    "RESULT requests=%d seconds=%.3f rps=%.2f p50_ms=%.2f p99_ms=%.2f max_ms=%.2f mb_read=%.1f " ..
    "errors=%d non2xx=%d s5xx=%d s503=%d s304=%d socket=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000, summary.bytes / 1e6,
    non2xx + socket, non2xx, s5xx, s503, s304, socket))
end
