-- wrk script shared by every scenario of bench/queue_load.py; configured through the environment:
--   BENCH_METHOD       GET or POST (default GET)
--   BENCH_BODY         request body; sent as application/json when set
--   BENCH_AUTH         none | cookie | token
--   BENCH_CREDENTIALS  file with one "<token>\t<session key>" line per annotator
--   BENCH_COOKIE_NAME  the session cookie's name (default sessionid)
--   BENCH_THREADS      wrk's -t, so that each thread takes its own share of the annotators
--
-- wrk 4 calls request() per thread, not per connection, so each thread hands its annotators out round-robin:
-- with as many annotators as connections, the requests in flight at one moment belong to different annotators
-- (an annotator's next request is only built after all the thread's other annotators had one).
-- response() counts non-2xx answers (wrk's own "Non-2xx" counter ignores 3xx) and keeps the first one seen;
-- done() prints one line "BENCH_JSON {...}" with the figures for the orchestrator.

local threads = {}
local counter = 0

function setup(thread)
   thread:set("thread_index", counter)
   counter = counter + 1
   table.insert(threads, thread)
end

local function read_credentials(path)
   local rows = {}
   for line in io.lines(path) do
      local token, session = line:match("^(%S+)\t(%S+)$")
      if token then
         table.insert(rows, { token = token, session = session })
      end
   end
   return rows
end

function init(args)
   non2xx = 0
   first_status = 0
   first_body = ""
   local method = os.getenv("BENCH_METHOD") or "GET"
   local body = os.getenv("BENCH_BODY")
   if body == "" then
      body = nil
   end
   local auth = os.getenv("BENCH_AUTH") or "none"
   local cookie_name = os.getenv("BENCH_COOKIE_NAME") or "sessionid"
   local nthreads = tonumber(os.getenv("BENCH_THREADS") or "1")
   local base = { Host = wrk.headers["Host"] }
   if body then
      base["Content-Type"] = "application/json"
   end

   requests = {}
   if auth == "none" then
      table.insert(requests, wrk.format(method, wrk.path, base, body))
   else
      local rows = read_credentials(os.getenv("BENCH_CREDENTIALS"))
      for i, row in ipairs(rows) do
         if (i - 1) % nthreads == thread_index then
            local headers = {}
            for k, v in pairs(base) do
               headers[k] = v
            end
            if auth == "cookie" then
               headers["Cookie"] = cookie_name .. "=" .. row.session
            else
               headers["Authorization"] = "Token " .. row.token
            end
            table.insert(requests, wrk.format(method, wrk.path, headers, body))
         end
      end
      if #requests == 0 then
         error("thread " .. thread_index .. " got no credentials from " .. tostring(os.getenv("BENCH_CREDENTIALS")))
      end
   end
   next_request = 1
end

function request()
   local req = requests[next_request]
   next_request = next_request % #requests + 1
   return req
end

function response(status, headers, body)
   if status < 200 or status > 299 then
      non2xx = non2xx + 1
      if first_status == 0 then
         first_status = status
         first_body = string.sub(body or "", 1, 300)
      end
   end
end

local function json_string(s)
   s = tostring(s)
   s = s:gsub("\\", "\\\\"):gsub('"', '\\"'):gsub("\n", "\\n"):gsub("\r", "\\r"):gsub("\t", "\\t")
   s = s:gsub("[%c]", function(c) return string.format("\\u%04x", string.byte(c)) end)
   return '"' .. s .. '"'
end

function done(summary, latency, requests)
   local non2xx_total, status, body = 0, 0, ""
   for _, thread in ipairs(threads) do
      non2xx_total = non2xx_total + (thread:get("non2xx") or 0)
      local s = thread:get("first_status") or 0
      if status == 0 and s ~= 0 then
         status = s
         body = thread:get("first_body") or ""
      end
   end
   local seconds = summary.duration / 1e6
   local e = summary.errors
   local fields = {
      string.format('"requests": %d', summary.requests),
      string.format('"duration_s": %.3f', seconds),
      string.format('"rps": %.2f', summary.requests / seconds),
      string.format('"bytes": %d', summary.bytes),
      string.format('"p50_ms": %.3f', latency:percentile(50) / 1000),
      string.format('"p90_ms": %.3f', latency:percentile(90) / 1000),
      string.format('"p99_ms": %.3f', latency:percentile(99) / 1000),
      string.format('"mean_ms": %.3f', latency.mean / 1000),
      string.format('"max_ms": %.3f', latency.max / 1000),
      string.format('"non2xx": %d', non2xx_total),
      string.format('"first_non2xx_status": %d', status),
      '"first_non2xx_body": ' .. json_string(body),
      string.format(
         '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}',
         e.connect, e.read, e.write, e.status, e.timeout
      ),
   }
   io.write("BENCH_JSON {" .. table.concat(fields, ", ") .. "}\n")
end
