// cellbox code-context driver for JavaScript (see sandbox/agent/code.go).
// Started by the agent as `node -e <this>`: fd 3 brings one JSON request per
// line ({"file": cell source path, "n": cell number, "max": bytes kept of the
// value, "timeout": milliseconds or 0}), fd 4 takes
// {"ready":true} once set up, then one JSON answer per line; fd 1 and 2 are
// pipes the agent reads, and after a cell the driver writes a marker
// ($CELLBOX_CODE_MARK and the cell number) to both, after all the cell
// wrote to process.stdout and process.stderr (see writeMark), before the
// answer.
// Cells run in this process's global context (vm.runInThisContext, as the
// node REPL does): var, let, const, function and class declarations and
// require()d modules persist between cells. The driver times a cell out
// itself (vm's timeout, then a timer on an awaited promise) and says so with
// "timed_out" in its answer: the agent's SIGINT is only the fallback, as
// node's vm takes the SIGINT listeners off while a script starts and ends
// (breakOnSigint), and a SIGINT in that instant would end node. SIGINT
// interrupts a running cell (breakOnSigint) or an awaited promise, and is
// ignored between cells.
(function () {
  const fs = require('fs');
  const vm = require('vm');
  const util = require('util');
  const path = require('path');
  const Module = require('module');
  const readline = require('readline');

  // The answer line must stay under the agent's limit for it (maxCodeAnswer,
  // 32 MiB), or the context ends: rich outputs, the value and the error are
  // each cut to a share of it, measured as JSON.
  const MAX_RICH = 16 << 20; // bytes of rich outputs per cell
  const MAX_VALUE = 8 << 20; // bytes of the value (the request's max, the streams' cap, is used when lower)
  const MAX_ERROR = 1 << 20; // bytes of an error's message, and of its stack
  const jsonBytes = (s) => Buffer.byteLength(JSON.stringify(s));
  // fit returns [s cut to at most limit bytes as JSON, whether it was cut].
  function fit(s, limit) {
    let n = jsonBytes(s);
    if (n <= limit) return [s, false];
    while (n > limit) {
      s = s.slice(0, Math.max(Math.floor(s.length * limit / n) - 1, 0));
      n = jsonBytes(s);
    }
    return [s, true];
  }
  const MARK = process.env.CELLBOX_CODE_MARK || '';
  delete process.env.CELLBOX_CODE_MARK;
  let outputs = [];
  let richBytes = 0;
  let interrupt = null; // rejects the awaited promise of a running cell

  process.on('SIGINT', () => { if (interrupt) interrupt(); });
  process.on('uncaughtException', (e) => { process.stderr.write('Uncaught ' + util.inspect(e) + '\n'); });
  process.on('unhandledRejection', (e) => { process.stderr.write('Unhandled rejection ' + util.inspect(e) + '\n'); });

  function addOutput(mime, data) {
    let item;
    if (Buffer.isBuffer(data) || data instanceof Uint8Array) {
      item = { mime, data: Buffer.from(data).toString('base64'), encoding: 'base64' };
    } else {
      item = { mime, data: typeof data === 'string' ? data : JSON.stringify(data) };
    }
    const size = jsonBytes(item.data);
    if (richBytes + size > MAX_RICH) {
      process.stderr.write(`[cellbox: a ${mime} output was dropped: over ${MAX_RICH >> 20} MiB of rich output in one cell]\n`);
      return;
    }
    richBytes += size;
    outputs.push(item);
  }

  // display(bundle) shows rich outputs: an object of MIME type -> data,
  // e.g. display({'text/html': '<b>hi</b>'}) or {'image/png': buffer};
  // display(data, mime) gives the type of one piece of data.
  global.display = function display(data, mime) {
    if (mime !== undefined) return addOutput(mime, data);
    if (data && typeof data === 'object' && !Buffer.isBuffer(data)) {
      for (const [m, d] of Object.entries(data)) addOutput(m, d);
      return;
    }
    process.stdout.write(util.inspect(data) + '\n');
  };
  global.require = Module.createRequire(path.join(process.cwd(), '/'));
  global.module = { exports: {} };
  global.exports = global.module.exports;

  function errorOf(e) {
    if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
      // The driver's frames (and node's below them) say nothing about the cell.
      const stack = String(e.stack || e).split('\n').filter((l) => !/^\s+at (.* \()?(\[eval\]|node:)/.test(l)).join('\n');
      return { name: String(e.name || 'Error'), message: fit(String(e.message), MAX_ERROR)[0], traceback: fit(stack, MAX_ERROR)[0] };
    }
    const shown = fit(util.inspect(e), MAX_ERROR)[0];
    return { name: 'Uncaught', message: shown, traceback: 'Uncaught ' + shown };
  }

  // Top-level await as in the node REPL: its own rewrite (node runs with
  // --expose-internals for it) turns a cell with await into an async
  // function, keeping its declarations at top level and returning the last
  // expression's value as {value}.
  let processTopLevelAwait = null;
  try {
    ({ processTopLevelAwait } = require('internal/repl/await'));
  } catch (e) { /* an older node: no top-level await */ }

  // timedOut is the error of a cell past its timeout.
  function timedOut(ms) {
    return Object.assign(new Error(`Script execution timed out after ${ms}ms`), { name: 'TimeoutError', timedOut: true });
  }

  async function run(src, n, timeout) {
    const file = `cell-${n}.js`;
    let wrapped = null;
    if (processTopLevelAwait && /\bawait\b/.test(src)) {
      try { wrapped = processTopLevelAwait(src); } catch (e) { wrapped = null; }
    }
    const start = Date.now();
    const opts = { filename: file, breakOnSigint: true };
    if (timeout > 0) opts.timeout = timeout;
    let value;
    try {
      value = vm.runInThisContext(wrapped === null ? src : wrapped, opts);
    } catch (e) {
      if (e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') throw timedOut(timeout);
      throw e;
    }
    if (value && typeof value.then === 'function') {
      let timer = null;
      try {
        value = await Promise.race([value, new Promise((_, reject) => {
          interrupt = () => reject(Object.assign(new Error('Script execution was interrupted by `SIGINT`'), { name: 'Interrupted' }));
          if (timeout > 0) timer = setTimeout(() => reject(timedOut(timeout)), Math.max(timeout - (Date.now() - start), 0));
        })]);
      } finally {
        clearTimeout(timer);
      }
    }
    if (wrapped !== null) value = value ? value.value : undefined;
    return value;
  }

  // The streams as the driver found them, and Writable's own write: a cell
  // may replace process.stdout, or its write.
  const stdio = [[1, process.stdout], [2, process.stderr]];
  const streamWrite = require('stream').Writable.prototype.write;

  // writeMark writes the end-of-cell marker after all the cell wrote to
  // fd: through its stream, and resolves once written. node writes to a
  // pipe asynchronously once the pipe is full, and keeps the rest queued
  // in the stream: a marker written to the fd itself went past it, and the
  // agent cut the cell's output there (and gave its tail to the next
  // cell). A stream the cell corked is uncorked; one it ended or destroyed
  // gets the marker on the fd itself.
  function writeMark(fd, stream, mark) {
    return new Promise((resolve) => {
      const direct = () => {
        try { fs.writeSync(fd, mark); } catch (e) { /* the cell closed it */ }
        resolve();
      };
      try {
        if (!stream.writable || stream.destroyed) return direct();
        while (stream.writableCorked > 0) stream.uncork();
        streamWrite.call(stream, mark, (err) => (err ? direct() : resolve()));
      } catch (e) {
        direct();
      }
    });
  }

  fs.writeSync(4, '{"ready":true}\n');
  // fd 3 is read as a socket (epoll), not a file stream: a file stream
  // reads a pipe in a thread-pool thread, blocked in read(2), and
  // process.exit() in a cell then waited for that thread for ever.
  const rl = readline.createInterface({ input: new (require('net').Socket)({ fd: 3, readable: true, writable: false }), crlfDelay: Infinity });
  (async () => {
    for await (const line of rl) {
      const r = JSON.parse(line);
      const src = fs.readFileSync(r.file, 'utf8');
      const out = {};
      outputs = [];
      richBytes = 0;
      try {
        const value = await run(src, r.n, r.timeout || 0);
        if (value !== undefined) {
          global._ = value;
          const [shown, cut] = fit(util.inspect(value, { depth: 4, maxArrayLength: 200, maxStringLength: 100000 }), Math.min(r.max || MAX_VALUE, MAX_VALUE));
          out.value = shown;
          if (cut) out.truncated = true;
        }
      } catch (e) {
        out.error = errorOf(e);
        if (e && e.timedOut === true) out.timed_out = true;
      } finally {
        interrupt = null;
      }
      out.outputs = outputs;
      const mark = MARK + String(r.n).padStart(8, '0');
      await Promise.all(stdio.map(([fd, stream]) => writeMark(fd, stream, mark)));
      fs.writeSync(4, JSON.stringify(out) + '\n');
    }
    process.exit(0);
  })();
})();
