-- wrk script for POST /v1/runs. Environment:
--   BENCH_TOKEN   bearer token (omitted when empty: the minimal endpoint)
--   BENCH_MODE    new (a unique key per request: prefix-thread-counter),
--                 replay (keys prefix-0 … prefix-(BENCH_KEYS-1), taken in turn),
--                 nokey (no dispatch_key)
--   BENCH_PREFIX  key prefix, unique per round
--   BENCH_KEYS    size of the replay key set
-- done() prints one JSON line (prefixed "WRKJSON ") the bench parses.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

local mode, prefix, keys, counter
local head = "{\"workflow_ref\":\"echo\",\"input\":{\"n\":1}"

function init(args)
  mode = os.getenv("BENCH_MODE") or "new"
  prefix = os.getenv("BENCH_PREFIX") or "k"
  keys = tonumber(os.getenv("BENCH_KEYS") or "50")
  counter = 0
  wrk.method = "POST"
  wrk.path = "/v1/runs"
  wrk.headers["Content-Type"] = "application/json"
  local token = os.getenv("BENCH_TOKEN") or ""
  if token ~= "" then wrk.headers["Authorization"] = "Bearer " .. token end
end

function request()
  counter = counter + 1
  local body
  if mode == "new" then
    body = head .. ",\"dispatch_key\":\"" .. prefix .. "-" .. tid .. "-" .. counter .. "\"}"
  elseif mode == "replay" then
    body = head .. ",\"dispatch_key\":\"" .. prefix .. "-" .. ((counter * 7 + tid) % keys) .. "\"}"
  else
    body = head .. "}"
  end
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  io.write(string.format(
    "WRKJSON {\"requests\":%d,\"duration_us\":%d,\"non2xx\":%d,\"connect_errors\":%d," ..
    "\"read_errors\":%d,\"write_errors\":%d,\"timeouts\":%d,\"p50_us\":%d,\"p99_us\":%d,\"max_us\":%d}\n",
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
