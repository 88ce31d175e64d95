#!/usr/bin/env python3
"""tllm serve against hostile but cheap clients, on loopback only, each run bounded in time and count:
slow and idle connections (they never lock others out: a deadline for a whole request, bounds per
address and in total), prompts whose cost is bounded before any expensive work, ambiguous request
framing, the request log, and a SIGTERM drain that answers every client and never hangs a new one.

usage: server_limits.py TLLM DEMO_MODEL"""
import json, os, re, signal, socket, subprocess, sys, threading, time

from checks import check, finish
import serve_util

TLLM, DEMO = sys.argv[1], sys.argv[2]
KEY = "sk-limits-" + "3" * 20
SLOW_HEAD = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: "


def Server(*args, key=KEY):
    return serve_util.Server(TLLM, DEMO, *args, *(["--api-key", key] if key else []), key=key)


def status(method, path, key=serve_util.OWN, timeout=5):
    """The status of a request, 0 when the connection failed (refused, reset, closed unanswered)"""
    try:
        return srv.request(method, path, key=key, timeout=timeout)[0]
    except (OSError, ValueError):
        return 0


def closed_by_peer(s, wait=0.0):
    """1 when the server closed s (end of stream or a reset), waiting up to `wait` seconds for it"""
    s.settimeout(max(wait, 0.001))
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


def connect(n, src="127.0.0.1", head=SLOW_HEAD):
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((src, 0))
        s.connect(("127.0.0.1", srv.port))
        s.sendall(head)
        out.append(s)
    return out


def trickle(socks):
    for s in socks:
        try:
            s.send(b"a")
        except OSError:
            pass


def raw(data, wait=1.0):
    """What the server answers to bytes sent as they are, until it closes (or `wait` passes)"""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(data)
    got, end = b"", time.time() + wait
    s.settimeout(0.2)
    closed = False
    while time.time() < end:
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
        if not d:
            closed = True
            break
        got += d
    s.close()
    return got, closed


# ---- slow and idle connections ----
srv = Server("-np", "1", "--max-queue", "0", "--request-timeout", "3", "--max-waiting", "24", "--max-waiting-per-ip", "16")
try:
    # 40 connections that send a header byte every half second (never idle, never complete)
    slow = connect(40)
    answers = []
    for i in range(4):
        time.sleep(0.5)
        trickle(slow)
        answers.append(status("GET", "/health", key=None))
        answers.append(status("GET", "/v1/models"))
    check(answers == [200] * 8, "/health and an authenticated request answered beside 40 slow connections: %s" % answers)
    open_now = [s for s in slow if not closed_by_peer(s)]
    check(len(open_now) <= 16, "one address keeps at most --max-waiting-per-ip 16 waiting connections: %d open" % len(open_now))
    # ... however often they send: closed at --request-timeout 3 from their opening
    deadline = time.time() + 8
    while time.time() < deadline and not all(closed_by_peer(s) for s in open_now):
        trickle(open_now)
        time.sleep(0.5)
    check(all(closed_by_peer(s) for s in slow), "slow connections are closed at the request deadline, sending or not")
    for s in slow:
        s.close()

    # a second address: the bound in all (24) closes the longest-waiting of anyone's
    a = connect(12, "127.0.0.2")
    b = connect(16)
    time.sleep(0.3)
    open_a, open_b = sum(not closed_by_peer(s) for s in a), sum(not closed_by_peer(s) for s in b)
    check(open_a + open_b <= 24 and open_b == 16 and status("GET", "/health", key=None) == 200,
          "--max-waiting 24 across addresses: %d + %d open, the newest kept" % (open_a, open_b))
    for s in a + b:
        s.close()

    # an idle keep-alive connection is closed at the deadline too (a client pool cannot pin threads)
    k = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first = k.recv(4096)
    t0 = time.time()
    gone = closed_by_peer(k, 8)
    check(first.startswith(b"HTTP/1.1 200") and gone and time.time() - t0 < 7,
          "an idle keep-alive connection is closed after --request-timeout (%.1f s)" % (time.time() - t0))
    k.close()

    # a body sent a byte at a time has the same deadline
    k = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    t0, gone = time.time(), False
    while time.time() - t0 < 8 and not gone:
        trickle([k])
        gone = closed_by_peer(k, 0.3)
    check(gone, "a body that never completes is closed at the deadline")
    k.close()

    # without the key nothing is read past the head, and the connection closes
    got, closed = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 401") and closed, "a request without the key: 401 and closed: %r" % got[:60])
finally:
    rc = srv.stop()
log = srv.stderr()
check(rc == 0 and re.search(r"closed \d+ connections that sent no complete request within 3 s", log) and
      "closed when reading" not in log, "slow connections: a summary line, not one per connection: %s" % log[-600:])

# ---- a prompt's cost: bytes (413), then tokens (stopped at the context), then the queue ----
srv = Server("-np", "1", "--max-queue", "0", "-c", "256", "--max-body", "5000000")
try:
    word = "a" * 4000000
    s, r = srv.post("/v1/completions", {"prompt": word, "max_tokens": 1})
    check(s == 400 and "more than 256 tokens" in r["error"]["message"], "a 4 MB one-word prompt: %s %s" % (s, str(r)[:200]))
    s, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 1000000}], "max_tokens": 1})
    check(s == 400 and "more than 256 tokens" in r["error"]["message"], "a 2 MB chat message: %s %s" % (s, str(r)[:200]))
    s, r = srv.post("/tokenize", {"content": word})
    check(s == 400 and "more than 256 tokens" in r["error"]["message"], "/tokenize of a 4 MB word: %s %s" % (s, str(r)[:200]))
    s, r = srv.post("/v1/completions", {"prompt": "What does ls do?", "max_tokens": 2})
    check(s == 200, "a short prompt beside them: %s" % s)
    got, closed = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 5000001\r\n\r\n"
                      % KEY.encode())
    check(got.startswith(b"HTTP/1.1 413") and closed, "a body past --max-body: 413 before it is read: %r" % got[:60])
finally:
    srv.stop()

# ---- framing a proxy could read otherwise (RFC 9112 6.3): 400 and closed, nothing smuggled ----
srv = Server("--quiet", key=None)
try:
    got, closed = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 38\r\n\r\n"
                      b"{}GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 400") and b"more than one Content-Length" in got and got.count(b"HTTP/1.1") == 1 and closed,
          "two Content-Length headers: %r" % got[:200])
    got, closed = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"2\r\n{}\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 400") and b"both Content-Length and Transfer-Encoding" in got and
          got.count(b"HTTP/1.1") == 1 and closed, "Content-Length and chunked: %r" % got[:200])
    for bad in (b"-1", b"12abc", b"+40", b"99999999999999999999"):
        got, closed = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + bad + b"\r\n\r\n")
        check(re.match(rb"HTTP/1.1 4\d\d", got) and closed, "Content-Length: %s: %r" % (bad.decode(), got[:80]))
    s, r = srv.request("GET", "/health", key=None)
    check(s == 200, "the server answers after them: %s" % s)
finally:
    srv.stop()

# ---- the request log: a line for every request, with the status it got ----
srv = Server(key=None)
try:
    srv.post("/v1/completions", {"prompt": "x", "max_tokens": 0})
    srv.post("/v1/completions", {"prompt": "x " * 5000, "max_tokens": 1})
    srv.post("/detokenize", {"tokens": [-1]})
    srv.post("/tokenize", {"content": 5})
    srv.post("/tokenize", {"content": "ls"})
    # a stream its client leaves: 499, not 200
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    body = json.dumps({"prompt": "What does ls do?", "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    c.recv(4096)
    c.close()
    deadline = time.time() + 20
    while time.time() < deadline and "499" not in srv.stderr():
        time.sleep(0.05)
finally:
    srv.stop()
log = srv.stderr()
for want in ("POST /v1/completions 400", "POST /detokenize 400", "POST /tokenize 400", "POST /tokenize 200",
             "POST /v1/completions 499"):
    check(want in log, "the log has '%s': %s" % (want, log[-800:]))
check(log.count("POST /v1/completions 400") == 2, "both refused completions logged: %s" % log[-800:])
check(not [l for l in log.splitlines() if "cancelled" in l and " 200: " in l], "no abandoned stream logged as 200")

# ---- SIGTERM: new connections get 503 and close at once (no hang); at --shutdown-timeout every request
#      still running is answered: 503 for a plain one, an error event and [DONE] for a stream ----
srv = Server("-np", "2", "--shutdown-timeout", "2", "--quiet", key=None)
try:
    long_req = {"prompt": "What does tar do?", "max_tokens": 20000, "ignore_eos": True}
    res = {}
    ts = [threading.Thread(target=lambda: res.update(plain=srv.post("/v1/completions", long_req, timeout=60))),
          threading.Thread(target=lambda: res.update(stream=srv.stream("/v1/completions", long_req)))]
    [t.start() for t in ts]
    deadline = time.time() + 30
    while time.time() < deadline and srv.request("GET", "/health")[1]["requests_processing"] < 2:
        time.sleep(0.02)
    srv.p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    t0 = time.time()
    got, closed = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", wait=5)
    check(got.startswith(b"HTTP/1.1 503") and b"stopping" in got and closed and time.time() - t0 < 4,
          "/health during the drain: 503 and closed, not a hang: %r (%.1f s)" % (got[:60], time.time() - t0))
    s, r = srv.post("/v1/completions", {"prompt": "ls", "max_tokens": 1}, timeout=10)
    check(s == 503 and "stopping" in r["error"]["message"], "a new request during the drain: %s %s" % (s, r))
    [t.join(60) for t in ts]
    s, r = res.get("plain", (0, None))
    check(s == 503 and "stopping" in str(r), "a request running past --shutdown-timeout is answered 503: %s %s" % (s, str(r)[:200]))
    events = res.get("stream", [])
    check(len(events) >= 2 and events[-1] == "[DONE]" and "stopping" in str(events[-2]),
          "a stream running past --shutdown-timeout ends with an error event and [DONE]: %s" % events[-2:])
    rc = srv.exited(30)
    check(rc == 0, "exit after the drain: %s %s" % (rc, srv.stderr()[-300:]))
finally:
    if srv.p.poll() is None:
        srv.p.kill()

# ... and a second signal cancels at once, with the same answers
srv = Server("-np", "1", "--shutdown-timeout", "600", "--quiet", key=None)
try:
    res = {}
    t = threading.Thread(target=lambda: res.update(plain=srv.post("/v1/completions", long_req, timeout=60)))
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and srv.request("GET", "/health")[1]["requests_processing"] < 1:
        time.sleep(0.02)
    srv.p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    srv.p.send_signal(signal.SIGTERM)
    t.join(60)
    s, r = res.get("plain", (0, None))
    check(s == 503 and "stopping" in str(r), "a second signal: the running request is answered 503: %s %s" % (s, str(r)[:200]))
    rc = srv.exited(30)
    check(rc == 0, "exit after a second signal: %s %s" % (rc, srv.stderr()[-300:]))
finally:
    if srv.p.poll() is None:
        srv.p.kill()

finish("server_limits")
