# cellbox code-context driver for Python (see sandbox/agent/code.go).
# Started by the agent as `python3 -c <this>`: fd 3 brings one JSON request
# per line ({"file": cell source path, "n": cell number, "max": bytes kept
# of the value}), fd 4 takes
# {"ready":true} once set up, then one JSON answer per line. fd 1 and 2
# are pipes the agent reads; after a cell the driver writes a marker (from
# $CELLBOX_CODE_MARK and the cell number) to both, before the answer.
# SIGINT interrupts a running cell (KeyboardInterrupt) and is ignored
# between cells.
def _cellbox_main():
    import ast, base64, builtins, json, linecache, os, signal, sys, traceback, warnings
    CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect (slow)

    req = os.fdopen(3, "rb", buffering=0)
    ans = os.fdopen(4, "wb", buffering=0)
    os.set_inheritable(3, False)
    os.set_inheritable(4, False)
    mark = os.environ.pop("CELLBOX_CODE_MARK", "")
    warnings.filterwarnings("ignore", message=".*non-interactive.*")  # plt.show() under Agg

    # The answer line must stay under the agent's limit for it (maxCodeAnswer,
    # 32 MiB), or the context ends: rich outputs, the value and the error
    # are each cut to a share of it, measured as JSON.
    MAX_RICH = 16 << 20  # bytes of rich outputs per cell
    MAX_VALUE = 8 << 20  # bytes of the value (the request's "max", the streams' cap, is used when lower)
    MAX_ERROR = 1 << 20  # bytes of an error's message, and of its traceback

    def fit(s, limit):
        """s, cut so that it is at most limit bytes as JSON; and whether it was cut."""
        n = len(json.dumps(s))
        if n <= limit:
            return s, False
        while n > limit:
            s = s[:max(len(s) * limit // n - 1, 0)]
            n = len(json.dumps(s))
        return s, True
    state = {"running": False, "outputs": [], "rich_bytes": 0, "loop": None}

    def on_sigint(signum, frame):
        if state["running"]:
            raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_sigint)

    def add_output(mime, data):
        if isinstance(data, bytes):
            item = {"mime": mime, "data": base64.b64encode(data).decode(), "encoding": "base64"}
        else:
            if not isinstance(data, str):
                data = json.dumps(data)
            item = {"mime": mime, "data": data}
        size = len(json.dumps(item["data"]))
        if state["rich_bytes"] + size > MAX_RICH:
            print("[cellbox: a %s output was dropped: over %d MiB of rich output in one cell]" % (mime, MAX_RICH >> 20), file=sys.stderr)
            return
        state["rich_bytes"] += size
        state["outputs"].append(item)

    def figure_png(fig):
        import io
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def rich(obj):
        """Adds obj's rich representations; True if it had one."""
        mod = type(obj).__module__ or ""
        if mod.startswith("matplotlib") and type(obj).__name__ == "Figure":
            add_output("image/png", figure_png(obj))
            return True
        found = False
        if hasattr(obj, "_repr_mimebundle_"):
            try:
                bundle = obj._repr_mimebundle_()
                if isinstance(bundle, tuple):
                    bundle = bundle[0]
                for mime, data in (bundle or {}).items():
                    if mime != "text/plain":
                        if mime.startswith("image/") and mime != "image/svg+xml" and isinstance(data, str):
                            data = base64.b64decode(data)
                        add_output(mime, data)
                        found = True
            except Exception:
                pass
            if found:
                return True
        for meth, mime in (("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"), ("_repr_svg_", "image/svg+xml"),
                           ("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"), ("_repr_json_", "application/json")):
            f = getattr(obj, meth, None)
            if f is None or isinstance(obj, type):
                continue
            try:
                data = f()
            except Exception:
                continue
            if isinstance(data, tuple):
                data = data[0]
            if data is None:
                continue
            if mime in ("image/png", "image/jpeg") and isinstance(data, str):
                data = base64.b64decode(data)
            add_output(mime, data)
            found = True
        return found

    def display(*objs, mime=None):
        """Show objects as rich outputs (PNG, SVG, HTML, JSON, ...).
        display(obj) uses obj's _repr_*_ methods or a matplotlib figure;
        display(data, mime="text/html") gives the MIME type of str/bytes data."""
        for obj in objs:
            if mime is not None:
                add_output(mime, obj)
            elif not rich(obj):
                print(repr(obj))

    # The cells run in __main__'s namespace, so pickle and dataclasses find
    # what they define; the driver's own names stay in this function.
    ns = sys.modules["__main__"].__dict__
    ns.clear()
    ns.update({"__name__": "__main__", "__builtins__": builtins, "display": display})

    def collect_figures(seen):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            if id(fig) not in seen:
                add_output("image/png", figure_png(fig))
        plt.close("all")

    class PyplotHook:
        """Makes plt.show() show the open figures (as PNG outputs) and close
        them, as in a notebook: matplotlib.pyplot gets its show replaced
        right after it is first imported. (MPLBACKEND stays Agg, which
        programs the code runs inherit.)"""
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name != "matplotlib.pyplot":
                return None
            for finder in sys.meta_path:
                if finder is cls or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    break
            else:
                return None
            load = spec.loader.exec_module
            def exec_module(module):
                load(module)
                module.show = lambda *args, **kwargs: collect_figures(set())
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, PyplotHook)

    def in_cell(tb):
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next
        return tb

    def error_of(e):
        if isinstance(e, SyntaxError) and (e.filename or "").startswith("<cell-"):
            lines = traceback.format_exception_only(type(e), e)
        else:
            lines = traceback.format_exception(type(e), e, in_cell(e.__traceback__))
        return {"name": type(e).__name__, "message": fit(str(e), MAX_ERROR)[0], "traceback": fit("".join(lines), MAX_ERROR)[0]}

    def run(src, n):
        fname = "<cell-%d>" % n
        linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        tree = ast.parse(src, fname)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        value = None
        for code in (compile(tree, fname, "exec", flags=flags), last and compile(last, fname, "eval", flags=flags)):
            if code is None:
                continue
            value = eval(code, ns)
            if code.co_flags & CO_COROUTINE:
                if state["loop"] is None:
                    import asyncio
                    state["loop"] = asyncio.new_event_loop()
                value = state["loop"].run_until_complete(value)
        return value if last is not None else None

    ans.write(b'{"ready":true}\n')
    while True:
        try:
            line = req.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        r = json.loads(line)
        with open(r["file"], encoding="utf-8", errors="replace") as f:
            src = f.read()
        out = {}
        state["outputs"], state["rich_bytes"] = [], 0
        seen = set()
        try:
            try:
                state["running"] = True
                value = run(src, r["n"])
            finally:
                state["running"] = False
            if value is not None:
                ns["_"] = value
                out["value"], cut = fit(repr(value), min(r.get("max") or MAX_VALUE, MAX_VALUE))
                if cut:
                    out["truncated"] = True
                if rich(value):
                    seen.add(id(value))
        except BaseException as e:  # SystemExit too: the context survives
            state["running"] = False
            out["error"] = error_of(e)
        try:
            collect_figures(seen)
        except BaseException as e:
            out.setdefault("error", error_of(e))
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass
        out["outputs"] = state["outputs"]
        for fd in (1, 2):
            try:
                os.write(fd, ("%s%08d" % (mark, r["n"])).encode())
            except OSError:
                pass
        ans.write(json.dumps(out).encode() + b"\n")

_cellbox_main()
