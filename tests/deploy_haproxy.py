"""docs/deploy/haproxy.cfg as written (its ports substituted): 3 tllm serve replicas behind HAProxy on
127.0.0.1, 200 chat requests from the official openai client (8 at a time, its default retries), one
replica SIGKILLed mid-run. Every request must be answered, each with the answer its prompt gets from a
replica directly (greedy), both survivors must have served some, and the balancer's health check must
take the dead one out. Skipped (77) without haproxy or the openai package.
usage: deploy_haproxy.py TLLM DEMO_MODEL"""
import concurrent.futures
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
from serve_util import Server  # noqa: E402

tllm, demo = sys.argv[1], sys.argv[2]
haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
try:
    import openai
except ImportError:
    openai = None
if not haproxy or openai is None:
    print("skip: %s is not installed" % ("haproxy (scripts/setup.sh installs it)" if not haproxy else "the openai package"))
    sys.exit(77)
if os.environ.get("TLLM_TEST_SANITIZED"):
    print("skip: the load-balancer recipe under the sanitizers (the server's own tests run there)")
    sys.exit(77)

KEY = "deploy-test-key"
PROMPTS = [f"What does {w} do? Case {i}." for i, w in enumerate("tar grep ls find sed awk cut sort uniq head".split() * 2)]
N_REQUESTS, KILL_AFTER = 200, 60


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


replicas = [Server(tllm, demo, "-np", "4", "--api-key", KEY, key=KEY) for _ in range(3)]
front = free_port()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "deploy", "haproxy.cfg")) as f:
    cfg = f.read()
cfg = cfg.replace("127.0.0.1:8080", f"127.0.0.1:{front}")
for i, r in enumerate(replicas):
    cfg = cfg.replace(f"127.0.0.1:{8081 + i}", f"127.0.0.1:{r.port}")
check(cfg.count("127.0.0.1:808") == 0, "every port of the recipe substituted")
tmp = tempfile.mkdtemp()
cfg_path = os.path.join(tmp, "haproxy.cfg")
with open(cfg_path, "w") as f:
    f.write(cfg)
lb_log = open(os.path.join(tmp, "haproxy.log"), "w+")
lb = subprocess.Popen([haproxy, "-f", cfg_path, "-db"], stdout=lb_log, stderr=subprocess.STDOUT)


def cleanup():
    lb.terminate()
    lb.wait(10)
    for r in replicas:
        if r.p.poll() is None:
            r.p.kill()
            r.p.wait()
    shutil.rmtree(tmp, ignore_errors=True)


try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{front}/v1", api_key=KEY, max_retries=4, timeout=120)
    deadline = time.time() + 30
    while True:  # the balancer listens and has found the replicas up
        try:
            client.models.list()
            break
        except openai.APIError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)

    def ask(prompt, c=client):
        r = c.chat.completions.create(model="tllm", messages=[{"role": "user", "content": prompt}], max_tokens=12,
                                      temperature=0)
        return r.choices[0].message.content

    # each prompt's answer from a replica directly: what every replica answers (greedy, one model)
    direct = openai.OpenAI(base_url=f"http://127.0.0.1:{replicas[0].port}/v1", api_key=KEY, max_retries=0)
    want = {p: ask(p, direct) for p in PROMPTS}
    before = [r.metrics()['tllm_requests_total{result="done"}'] for r in replicas]

    answered, lock = [], threading.Lock()
    killed = threading.Event()

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        try:
            got = ask(p)
        except Exception as e:  # noqa: BLE001 (a request the client could not get answered: lost)
            got = e
        with lock:
            answered.append((p, got))
            if len(answered) == KILL_AFTER and not killed.is_set():
                replicas[1].p.send_signal(signal.SIGKILL)  # mid-run: requests are in flight on it
                killed.set()
        return got

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(N_REQUESTS)))
    lost = [(p, g) for p, g in answered if isinstance(g, Exception)]
    wrong = [(p, g) for p, g in answered if not isinstance(g, Exception) and g != want[p]]
    check(killed.is_set() and replicas[1].p.wait(10) == -signal.SIGKILL, "replica 2 was killed mid-run")
    check(len(answered) == N_REQUESTS and not lost, f"{len(lost)} of {N_REQUESTS} requests lost: {lost[:2]}")
    check(not wrong, f"{len(wrong)} answers differ from the replicas' own: {wrong[:2]}")
    served = [replicas[i].metrics()['tllm_requests_total{result="done"}'] - before[i] for i in (0, 2)]
    check(all(s > 0 for s in served), f"least-connections spread the load over the survivors: {served}")
    # the health check has taken the dead replica out: a burst after the run reaches only the living
    time.sleep(2.5)
    lb_log.flush()
    lb_log.seek(0)
    log = lb_log.read()
    check(re.search(r"Server tllm/r2 is DOWN", log) is not None, "HAProxy marked r2 down:\n" + log[-2000:])
    after = sum(replicas[i].metrics()['tllm_requests_total{result="done"}'] for i in (0, 2))
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        burst = list(ex.map(lambda p: ask(p, openai.OpenAI(base_url=f"http://127.0.0.1:{front}/v1", api_key=KEY,
                                                                 max_retries=0)), PROMPTS[:8]))
    check(burst == [want[p] for p in PROMPTS[:8]], "after r2 is down, requests need no retry")
    check(sum(replicas[i].metrics()['tllm_requests_total{result="done"}'] for i in (0, 2)) - after == 8,
          "the burst went to the survivors")
    print(f"{N_REQUESTS} requests through HAProxy, r2 killed after {KILL_AFTER} answers: survivors served {served}")
finally:
    cleanup()
finish("deploy_haproxy")
