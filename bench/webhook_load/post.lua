-- wrk script: POST one fixed AdmissionReview body over and over, keep-alive.
--   wrk -s post.lua <url>/mutate -- BODY_FILE [DELAY_MS]
-- DELAY_MS (optional) sleeps before each request on each connection, for fixed-rate runs:
-- with C connections the offered rate is at most C * 1000 / DELAY_MS requests per second.
-- done() prints one JSON line (prefix "RESULT ") for the runner to parse.

local delay_ms = 0

function init(args)
  local path = args[1]
  if path == nil then
    error("usage: wrk -s post.lua URL -- BODY_FILE [DELAY_MS]")
  end
  local f = assert(io.open(path, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  if args[2] ~= nil then
    delay_ms = tonumber(args[2])
  end
end

function delay()
  return delay_ms
end

-- No response() hook on purpose: defining one makes wrk hand every body to Lua, which costs the
-- load generator CPU. summary.errors.status counts answers >= 400.

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean))
end
