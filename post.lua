wrk.method = "POST"
wrk.body = '{"model":"fast","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
