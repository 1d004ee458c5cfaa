"""The device checks' verdict lines, shared by the shell checks' inline Python (run from the repo root with
PYTHONPATH=tests/device): check() prints "<name>: OK|BAD <what was measured>", passed() says whether all were OK."""
_all_ok = True


def check(name, cond, what):
    global _all_ok
    _all_ok &= bool(cond)
    print(f"{name}: {'OK ' if cond else 'BAD'} {what}")
    return bool(cond)


def passed():
    return _all_ok
