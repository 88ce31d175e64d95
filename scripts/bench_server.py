#!/usr/bin/env python3
"""Aggregate throughput of an OpenAI-compatible server (tllm serve, llama-server, vLLM) at several
numbers of concurrent clients: each client sends requests one after another to /v1/completions,
a prompt of about --prompt-tokens tokens that no other request shares (no prefix cache helps) and
exactly --max-tokens generated tokens (ignore_eos), greedy. Prints a table (or --json lines):
clients, requests, generated tokens per second of wall time (all clients together), and the
latency of a request (p50, p99). Python's standard library only.

usage: bench_server.py URL [--clients 1,16,64] [--requests 2] [--prompt-tokens 128] [--max-tokens 128]
                           [--api-key KEY] [--model NAME] [--json] [--llama-native] [--count-failed]
  --requests N   requests per client at each level (default 2)"""
import argparse, http.client, json, sys, threading, time, urllib.parse

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly box jumping frogs near "
         "old stone bridges and rivers that wind through green valleys under bright summer skies").split()


def prompt(i, n_tokens):
    # about one token a word; the request's number first, so no two prompts share a prefix
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n_tokens - 4)]
    return "Request %d: %s" % (i, " ".join(words))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--api-key")
    ap.add_argument("--model", default="any")
    ap.add_argument("--json", action="store_true")
    # llama-server's own /completion: its OpenAI endpoints parse the output as a chat format and fail
    # some requests whose random-weight text does not parse (500 "does not match the expected format")
    ap.add_argument("--llama-native", action="store_true")
    # with ignore_eos a request that ends in a server error has generated its max_tokens first (the
    # parser above runs on the finished text): count them, and say how many there were
    ap.add_argument("--count-failed", action="store_true")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    serial = [0]
    lock = threading.Lock()

    def one(i):
        body = {"model": a.model, "prompt": prompt(i, a.prompt_tokens), "max_tokens": a.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": False}
        if a.llama_native:
            body["n_predict"] = body.pop("max_tokens")
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=3600)
        t0 = time.time()
        c.request("POST", "/completion" if a.llama_native else "/v1/completions", body=json.dumps(body), headers=headers)
        r = c.getresponse()
        data = json.loads(r.read())
        c.close()
        if r.status != 200 and a.count_failed and r.status >= 500:
            return time.time() - t0, a.max_tokens, True  # generated, then refused: counted, and reported as failed
        if r.status != 200:
            raise RuntimeError("request %d: %d %s" % (i, r.status, str(data)[:300]))
        return time.time() - t0, data["tokens_predicted"] if a.llama_native else data["usage"]["completion_tokens"], False

    if not a.json:
        print("%8s %9s %7s %12s %9s %9s" % ("clients", "requests", "failed", "gen tok/s", "p50 s", "p99 s"))
    for n in [int(x) for x in a.clients.split(",")]:
        lat, toks, errors = [], [0], []

        def client():
            for _ in range(a.requests):
                with lock:
                    serial[0] += 1
                    i = serial[0]
                try:
                    dt, k, refused = one(i)
                except Exception as e:  # counted and shown: a failed request is no throughput
                    with lock:
                        errors.append(str(e))
                    continue
                with lock:
                    lat.append(dt)
                    toks[0] += k
                    if refused:
                        errors.append("request %d: a server error after generating (counted)" % i)

        t0 = time.time()
        ts = [threading.Thread(target=client) for _ in range(n)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        el = time.time() - t0
        if errors:
            print("%d of %d requests failed, e.g. %s" % (len(errors), n * a.requests, errors[0]), file=sys.stderr)
        if not lat:
            continue
        lat.sort()
        p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        if a.json:
            print(json.dumps({"clients": n, "requests": len(lat), "failed": len(errors), "gen_tokens": toks[0], "secs": el,
                              "gen_tps": toks[0] / el, "p50_s": p50, "p99_s": p99}))
        else:
            print("%8d %9d %7d %12.1f %9.2f %9.2f" % (n, len(lat), len(errors), toks[0] / el, p50, p99), flush=True)


if __name__ == "__main__":
    main()
