"""A Python session that outlives each command.

    python3 session.py 'import math; r = 2'
    python3 session.py 'print(math.pi * r ** 2)'      # 12.566370614359172

Each call runs its code with the variables (and imported modules) the
previous calls left. They are kept in /workspace/.session.pickle: the box and
its files persist between the commands of the `run` stream, so the session
does. Values that cannot be pickled (open files, sockets) are dropped.
"""
import importlib
import pickle
import sys
import types

STATE = "/workspace/.session.pickle"

env = {"__name__": "__session__"}
try:
    with open(STATE, "rb") as f:
        saved = pickle.load(f)
    env.update(saved["vars"])
    for name, module in saved["modules"].items():
        env[name] = importlib.import_module(module)
except FileNotFoundError:
    pass

code = " ".join(sys.argv[1:]) or sys.stdin.read()
try:
    exec(compile(code, "<session>", "exec"), env)
finally:
    saved = {"vars": {}, "modules": {}}
    for k, v in env.items():
        if k.startswith("__"):
            continue
        if isinstance(v, types.ModuleType):
            saved["modules"][k] = v.__name__
            continue
        try:
            pickle.dumps(v)
        except Exception:
            continue
        saved["vars"][k] = v
    with open(STATE, "wb") as f:
        pickle.dump(saved, f)
