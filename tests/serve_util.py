"""A tllm serve process for the server tests: started on a free local port (--port 0; the port is read
from its stderr), with plain-HTTP helpers as OpenAI clients use it."""
import http.client, json, os, re, signal, subprocess, tempfile, time

from checks import check

OWN = object()  # a request's key: the server's own


class Server:
    def __init__(self, tllm, model, *args, key=None):
        self.key = key
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ)
        if "--device" in args:  # PoCL's LLVM under LeakSanitizer: see tests/parallel.py's run()
            env["ASAN_OPTIONS"] = (env["ASAN_OPTIONS"] + ":" if env.get("ASAN_OPTIONS") else "") + "detect_leaks=0"
        self.p = subprocess.Popen([tllm, "serve", "-m", model, "--port", "0", "-t", "2", *args],
                                  stdout=subprocess.DEVNULL, stderr=self.err, env=env)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.p.poll() is None:
            m = re.search(rb"listening on http://[^ ]*:(\d+)", self.stderr().encode())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if self.port is None:
            raise SystemExit("the server did not start: " + self.stderr())

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def request(self, method, path, body=None, key=OWN, headers=None, timeout=120):
        """(status, the JSON answer or its text); key: the server's own unless given (None: no key sent)"""
        key = self.key if key is OWN else key
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        if key:
            h["Authorization"] = "Bearer " + key
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode(errors="replace")

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body, key=OWN):
        """The events of a streamed answer (the JSON objects, then the string "[DONE]")."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        key = self.key if key is OWN else key
        h = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
        c.request("POST", path, body=json.dumps({**body, "stream": True}), headers=h)
        r = c.getresponse()
        check(r.status == 200 and r.getheader("Content-Type", "").startswith("text/event-stream"),
              "stream status %d %s" % (r.status, r.getheader("Content-Type")))
        events = []
        for block in r.read().decode().split("\n\n"):
            if block.startswith("data: "):
                d = block[6:]
                events.append(d if d == "[DONE]" else json.loads(d))
        c.close()
        return events

    def metrics(self):
        s, text = self.request("GET", "/metrics")
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z][^\s#]*) (\S+)$", text, re.M)}

    def idle(self, timeout=10):
        """/health once nothing runs or waits and every KV block is free (its counts are as of the engine's
        last step, which ends just after the last answer is sent; between steps none may run while
        requests still wait to be taken), or as it is when the time is up."""
        deadline = time.time() + timeout
        while True:
            s, h = self.request("GET", "/health")
            if (h["requests_processing"] == 0 and h.get("requests_waiting", 0) == 0 and
                    h["kv_blocks_free"] == h["kv_blocks_total"]) or time.time() > deadline:
                return h
            time.sleep(0.02)

    def exited(self, timeout=60):
        """The exit status once the process ends by itself (None: still running after timeout)"""
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, timeout=60):
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return None


def real_model_client(tllm, real, what, *args):
    """(a server on the real model, an openai client of it), or None after a note saying why not: no openai
    package, no model file (scripts/fetch_model.sh qwen2.5-coder-0.5b), or a sanitized build (minutes)"""
    try:
        import openai
    except ImportError as e:
        print(f"note: the openai package is not installed ({e}): {what} not run")
        return None
    if not os.path.exists(real):
        print(f"note: {real} is absent (scripts/fetch_model.sh qwen2.5-coder-0.5b): {what} not run")
        return None
    if os.environ.get("TLLM_TEST_SANITIZED"):
        print(f"note: {what} not run under the sanitizers (minutes)")
        return None
    srv = Server(tllm, real, *args)
    return srv, openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused")
