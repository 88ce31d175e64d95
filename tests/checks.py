"""The pass/fail counting the Python test scripts share: check() each condition, finish() reports and
exits non-zero when any failed."""
import sys

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def finish(name=None):
    print("%s%d passed, %d failed" % (name + ": " if name else "", passed, failed))
    sys.exit(1 if failed else 0)
