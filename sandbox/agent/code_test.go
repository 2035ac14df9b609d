package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

func runCell(t *testing.T, a *testAgent, id, code string, timeoutMs int) CodeResult {
	t.Helper()
	return runReq(t, a, id, CodeRunRequest{Code: code, TimeoutMs: timeoutMs})
}

func runReq(t *testing.T, a *testAgent, id string, req CodeRunRequest) CodeResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := a.c.CodeRun(ctx, id, req)
	require.NoError(t, err)
	return res
}

func newContext(t *testing.T, a *testAgent, lang string) string {
	t.Helper()
	cc, err := a.c.CodeCreate(context.Background(), CodeContextRequest{Language: lang})
	require.NoError(t, err)
	assert.Equal(t, lang, cc.Language)
	return cc.ID
}

func TestCodeContextPython(t *testing.T) {
	testenv.RequireCommand(t, "python3")
	a := startAgent(t)
	id := newContext(t, a, LangPython)

	r := runCell(t, a, id, "import os\nx = 40\nprint('hi'); os.system('echo sub >&2')\nx + 2", 0)
	require.Nil(t, r.Error)
	require.NotNil(t, r.Value)
	assert.Equal(t, "42", *r.Value)
	assert.Equal(t, "hi\n", r.Stdout)
	assert.Equal(t, "sub\n", r.Stderr)

	r = runCell(t, a, id, "os.getpid() > 0, x", 0)
	require.Nil(t, r.Error, "the import and the variable persist")
	assert.Equal(t, "(True, 40)", *r.Value)

	r = runCell(t, a, id, "def f():\n    return 1/0\nf()", 0)
	require.NotNil(t, r.Error)
	assert.Equal(t, "ZeroDivisionError", r.Error.Name)
	assert.Contains(t, r.Error.Traceback, "return 1/0")
	assert.NotContains(t, r.Error.Traceback, "_cellbox_main", "the driver's frames are not shown")

	r = runCell(t, a, id, "y = 1\nwhile True: pass", 300)
	assert.True(t, r.TimedOut)
	require.NotNil(t, r.Error)
	assert.Equal(t, "KeyboardInterrupt", r.Error.Name)
	assert.Empty(t, r.Ended)

	r = runCell(t, a, id, "x + y", 0)
	require.Nil(t, r.Error, "the context survived the interrupt")
	assert.Equal(t, "41", *r.Value)

	r = runCell(t, a, id, "None", 0)
	assert.Nil(t, r.Value)

	r = runCell(t, a, id, "import asyncio\nawait asyncio.sleep(0)\nx + 1", 0)
	require.Nil(t, r.Error, "top-level await: %v", r.Error)
	assert.Equal(t, "41", *r.Value)

	// A cell that prints without end: the first MaxOutput bytes are kept,
	// the rest is drained and dropped (neither memory nor disk fill up),
	// and the next cell's output is its own.
	r = runReq(t, a, id, CodeRunRequest{Code: "import sys\nfor i in range(50000): sys.stdout.write('y' * 1000)\n'done'", MaxOutput: 1000})
	require.Nil(t, r.Error)
	assert.Equal(t, "'done'", *r.Value)
	assert.True(t, r.Truncated)
	assert.Equal(t, strings.Repeat("y", 1000), r.Stdout)
	r = runCell(t, a, id, "import stat\nprint('next')\nstat.S_ISFIFO(os.fstat(1).st_mode)", 0)
	assert.Equal(t, "next\n", r.Stdout)
	assert.False(t, r.Truncated)
	assert.Equal(t, "True", *r.Value, "stdout is a pipe the agent drains, not a file that grows")

	list, err := a.c.CodeContexts(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, 9, list[0].Cells)

	require.NoError(t, a.c.CodeDelete(context.Background(), id))
	_, err = a.c.CodeRun(context.Background(), id, CodeRunRequest{Code: "1"})
	assert.ErrorContains(t, err, "ended: it was deleted")
}

func TestCodeContextBashAndJS(t *testing.T) {
	testenv.RequireCommand(t, "node")
	a := startAgent(t)
	sh := newContext(t, a, LangBash)
	r := runCell(t, a, sh, "mkdir -p sub && cd sub && V=7", 0)
	require.NotNil(t, r.ExitCode)
	assert.Equal(t, 0, *r.ExitCode)
	r = runCell(t, a, sh, "echo $V $(basename $PWD); false", 0)
	assert.Equal(t, "7 sub\n", r.Stdout)
	assert.Equal(t, 1, *r.ExitCode)
	r = runCell(t, a, sh, "sleep 100", 300)
	assert.True(t, r.TimedOut)
	assert.Equal(t, 130, *r.ExitCode)
	r = runCell(t, a, sh, "echo $V", 0)
	assert.Equal(t, "7\n", r.Stdout)

	js := newContext(t, a, LangJavaScript)
	r = runCell(t, a, js, "const path = require('path'); let n = 2; console.log('hi'); n * 21", 0)
	require.Nil(t, r.Error)
	assert.Equal(t, "42", *r.Value)
	assert.Equal(t, "hi\n", r.Stdout)
	assert.Empty(t, r.Stderr)
	r = runCell(t, a, js, "while (true) {}", 300)
	assert.True(t, r.TimedOut)
	require.NotNil(t, r.Error)
	r = runCell(t, a, js, "({n, base: path.basename('/a/b')})", 0)
	require.Nil(t, r.Error)
	assert.Equal(t, "{ n: 2, base: 'b' }", *r.Value)
	r = runCell(t, a, js, "new Promise(r => setTimeout(() => r(5), 10))", 0)
	require.Nil(t, r.Error, "a promise is awaited: %v", r.Error)
	assert.Equal(t, "5", *r.Value)
	r = runCell(t, a, js, "let later = await new Promise(r => setTimeout(() => r(6), 10)); later + 1", 0)
	require.Nil(t, r.Error, "top-level await: %v", r.Error)
	assert.Equal(t, "7", *r.Value)
	r = runCell(t, a, js, "later", 0)
	require.Nil(t, r.Error, "a declaration of an awaiting cell persists: %v", r.Error)
	assert.Equal(t, "6", *r.Value)
	r = runCell(t, a, js, "null.x", 0)
	require.NotNil(t, r.Error)
	assert.Equal(t, "TypeError", r.Error.Name)
	assert.Contains(t, r.Error.Traceback, "cell-7.js:1")
	assert.NotContains(t, r.Error.Traceback, "[eval]", "the driver's frames are not shown")
}

func TestCodeContextRichOutputs(t *testing.T) {
	testenv.RequireCommand(t, "node")
	a := startAgent(t)
	py := newContext(t, a, LangPython)
	r := runCell(t, a, py, `class Pic:
    def _repr_svg_(self):
        return '<svg xmlns="http://www.w3.org/2000/svg"/>'
display('<b>hi</b>', mime='text/html')
display({'a': 1}, mime='application/json')
Pic()`, 0)
	require.Nil(t, r.Error)
	assert.Equal(t, []CodeOutput{
		{MIME: "text/html", Data: "<b>hi</b>"},
		{MIME: "application/json", Data: `{"a": 1}`},
		{MIME: "image/svg+xml", Data: `<svg xmlns="http://www.w3.org/2000/svg"/>`},
	}, r.Outputs)
	r = runCell(t, a, py, "display(b'\\x89PNG', mime='image/png')", 0)
	assert.Equal(t, []CodeOutput{{MIME: "image/png", Data: "iVBORw==", Encoding: "base64"}}, r.Outputs)

	js := newContext(t, a, LangJavaScript)
	r = runCell(t, a, js, "display({'text/html': '<i>y</i>'}); display(Buffer.from([137, 80, 78, 71]), 'image/png')", 0)
	require.Nil(t, r.Error)
	assert.Equal(t, []CodeOutput{{MIME: "text/html", Data: "<i>y</i>"}, {MIME: "image/png", Data: "iVBORw==", Encoding: "base64"}}, r.Outputs)
}

func TestCodeContextEnds(t *testing.T) {
	testenv.RequireCommand(t, "node")
	a := startAgent(t)
	ctx := context.Background()

	// A cell that ignores the interrupt: the interpreter is killed after
	// the grace, and the context says why it ended.
	py := newContext(t, a, LangPython)
	r := runCell(t, a, py, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('stuck')\nwhile True: pass", 200)
	assert.True(t, r.TimedOut)
	assert.Contains(t, r.Ended, "did not stop within 3s of an interrupt (SIGINT) and was killed")
	assert.Equal(t, "stuck\n", r.Stdout)
	_, err := a.c.CodeRun(ctx, py, CodeRunRequest{Code: "1"})
	assert.ErrorContains(t, err, "code context "+py+" ended: the interpreter did not stop")
	assert.True(t, IsCode(err, CodeNotFound))

	// A timeout right after the start interrupts the cell, never the
	// interpreter's start (create waits until the driver is ready).
	for lang, cell := range map[string]string{LangPython: "2", LangBash: "echo 2", LangJavaScript: "2"} {
		id := newContext(t, a, lang)
		r := runCell(t, a, id, cell, 1)
		assert.Empty(t, r.Ended, lang)
		r = runCell(t, a, id, cell, 0)
		assert.Empty(t, r.Ended, lang)
		require.NoError(t, a.c.CodeDelete(ctx, id))
	}

	// A timeout that lands before the driver begins the cell (SIGINT is
	// ignored between cells) still stops it: the interrupt is sent again
	// until the cell answers. The context died after the 3 s grace about
	// once in 30 such cells.
	// A long comment makes the driver's reading of the cell take longer
	// than the timeout, so the first SIGINT lands there.
	long := "#" + strings.Repeat("x", 16<<20) + "\n"
	for lang, loop := range map[string]string{LangPython: long + "while True: pass", LangBash: "while :; do :; done"} {
		id := newContext(t, a, lang)
		for i := range 8 {
			r := runCell(t, a, id, loop, 1+i%3)
			require.Empty(t, r.Ended, "%s cell %d", lang, i)
			require.True(t, r.TimedOut, "%s cell %d", lang, i)
		}
		require.NoError(t, a.c.CodeDelete(ctx, id))
	}

	// A JavaScript context survives timeouts that land as node starts or
	// ends a cell: node's vm takes the SIGINT listeners off while a script
	// starts and ends (breakOnSigint), and a SIGINT in that instant ended
	// node, and the context with it, about once in 20 such cells here.
	// The driver now times its cells out itself.
	js := newContext(t, a, LangJavaScript)
	runCell(t, a, js, "let kept = 7", 0)
	for i := range 60 {
		r := runCell(t, a, js, "let x = 0; for (let i = 0; i < 20000; i++) x += i; x", 1+i%3)
		require.Empty(t, r.Ended, "cell %d", i)
	}
	r = runCell(t, a, js, "kept", 0)
	require.Empty(t, r.Ended)
	assert.Equal(t, "7", *r.Value)
	r = runCell(t, a, js, "while (true) {}", 200)
	assert.True(t, r.TimedOut)
	require.NotNil(t, r.Error)
	assert.Equal(t, "7", *runCell(t, a, js, "kept", 0).Value, "a timed-out cell keeps the context")
	r = runCell(t, a, js, "await new Promise(() => {})", 200)
	assert.True(t, r.TimedOut, "an awaited promise times out too")
	require.NotNil(t, r.Error)
	assert.Equal(t, "7", *runCell(t, a, js, "kept", 0).Value)

	// exit in bash ends the shell, and with it the context; Python's
	// exit() is an exception like any other.
	sh := newContext(t, a, LangBash)
	r = runCell(t, a, sh, "echo bye; exit 3", 0)
	assert.Equal(t, "its interpreter exited (exit code 3)", r.Ended)
	assert.Equal(t, "bye\n", r.Stdout)
	// node's process.exit too, at once (it waited for a thread blocked
	// reading the driver's requests until the timeout's SIGINT killed it).
	r = runCell(t, a, newContext(t, a, LangJavaScript), "process.exit(3)", 20000)
	assert.Equal(t, "its interpreter exited (exit code 3)", r.Ended)
	assert.False(t, r.TimedOut)
	py = newContext(t, a, LangPython)
	r = runCell(t, a, py, "v = 1\nexit(2)", 0)
	require.NotNil(t, r.Error)
	assert.Equal(t, "SystemExit", r.Error.Name)
	assert.Equal(t, "1", *runCell(t, a, py, "v", 0).Value)

	// A cell that sends its stdout and stderr elsewhere while something
	// it started holds the pipes: no marker comes, and the call still
	// returns (after markerWait) with what came.
	held := newContext(t, a, LangPython)
	r = runCell(t, a, held, "import subprocess, os\nprint('before', flush=True)\nsubprocess.Popen(['sleep', '60'])\nnull = os.open(os.devnull, os.O_WRONLY)\nos.dup2(null, 1); os.dup2(null, 2)\n'back'", 0)
	assert.Equal(t, "'back'", *r.Value)
	assert.Equal(t, "before\n", r.Stdout)
	require.NoError(t, a.c.CodeDelete(ctx, held))

	// Unknown ids and languages.
	_, err = a.c.CodeRun(ctx, "python-nope", CodeRunRequest{Code: "1"})
	assert.ErrorContains(t, err, "no code context python-nope in this box")
	_, err = a.c.CodeRun(ctx, "python-abcdef-1", CodeRunRequest{Code: "1"})
	assert.ErrorContains(t, err, "before it restarted (or slept and woke)")
	_, err = a.c.CodeCreate(ctx, CodeContextRequest{Language: "ruby"})
	assert.ErrorContains(t, err, `unknown language "ruby": want one of python, javascript, bash`)

	// A box has at most MaxCodeContexts.
	list, err := a.c.CodeContexts(ctx)
	require.NoError(t, err)
	for range MaxCodeContexts - len(list) {
		newContext(t, a, LangBash)
	}
	_, err = a.c.CodeCreate(ctx, CodeContextRequest{Language: LangBash})
	assert.ErrorContains(t, err, "this box has 8 code contexts, the most it may have")
	assert.True(t, IsCode(err, CodeTooLarge))
	require.NoError(t, a.c.CodeDelete(ctx, py))
	newContext(t, a, LangBash)
}

// TestCodeContextDriverPipes: code that writes to or closes the driver's
// answer pipe ends its context with a clear error; nothing hangs.
func TestCodeContextDriverPipes(t *testing.T) {
	a := startAgent(t)
	for code, want := range map[string]string{
		"import os\nos.write(4, b'junk\\n')\nwhile True: pass": "bad answer",
		"import os, time\nos.close(4)\ntime.sleep(30)":         "answer pipe was closed",
	} {
		id := newContext(t, a, LangPython)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := a.c.CodeRun(ctx, id, CodeRunRequest{Code: code})
		cancel()
		if err == nil {
			assert.Contains(t, res.Ended, want)
		} else {
			assert.ErrorContains(t, err, want)
		}
		_, err = a.c.CodeRun(context.Background(), id, CodeRunRequest{Code: "1"})
		assert.ErrorContains(t, err, want)
	}
}

// TestCodeContextBigAnswers: a huge value, exception or rich output is cut
// in the driver (the value at MaxOutput, as the streams, and marked
// truncated) and the context survives; before, an answer line past the
// agent's 32 MiB limit ended the context ("token too long") and a value
// under it came back whole.
func TestCodeContextBigAnswers(t *testing.T) {
	testenv.RequireCommand(t, "node")
	a := startAgent(t)
	const max = 64 << 10
	ctxs := map[string]string{LangPython: newContext(t, a, LangPython), LangJavaScript: newContext(t, a, LangJavaScript)}
	for _, tc := range []struct {
		name, lang, code string
		cutValue         bool // the value is cut to max bytes
		cutError         bool // the exception's message is cut to 1 MiB
		stderr           string
	}{
		{"py value 40 MB", LangPython, `"v" * 40_000_000`, true, false, ""},
		{"py value escaped", LangPython, `"\x01" * 3_000_000`, true, false, ""},
		{"py non-ASCII value", LangPython, `"é" * 20_000_000`, true, false, ""},
		{"py exception 40 MB", LangPython, `raise ValueError("x" * 40_000_000)`, false, true, ""},
		{"py rich output 60 MB as JSON", LangPython, `display("\u2028" * 10_000_000, mime="text/html")`, false, false, "a text/html output was dropped"},
		{"js value", LangJavaScript, `'v'.repeat(90000) + 'w'.repeat(90000)`, true, false, ""},
		{"js exception 40 MB", LangJavaScript, `throw new Error('x'.repeat(40000000))`, false, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := ctxs[tc.lang]
			r := runReq(t, a, id, CodeRunRequest{Code: tc.code, MaxOutput: max})
			require.Empty(t, r.Ended, "the context survives")
			if tc.cutValue {
				require.NotNil(t, r.Value)
				assert.True(t, r.Truncated)
				assert.Greater(t, len(*r.Value), max/8)
				assert.LessOrEqual(t, len(*r.Value), max)
			} else {
				assert.Nil(t, r.Value)
			}
			if tc.cutError {
				require.NotNil(t, r.Error)
				assert.LessOrEqual(t, len(r.Error.Message), 1<<20)
				assert.Greater(t, len(r.Error.Message), 1<<19)
				assert.LessOrEqual(t, len(r.Error.Traceback), 1<<20)
			}
			assert.Empty(t, r.Outputs)
			if tc.stderr != "" {
				assert.Contains(t, r.Stderr, tc.stderr)
			}
			r = runCell(t, a, id, "1 + 1", 0)
			require.NotNil(t, r.Value, "the context still runs cells: %+v", r)
			assert.Equal(t, "2", *r.Value)
			assert.False(t, r.Truncated)
		})
	}
}

// TestCodeContextJSBigOutput: a JavaScript cell's output is whole and in
// order before its end marker. node writes to a pipe asynchronously once the
// pipe is full, and the driver wrote its marker with fs.writeSync past the
// queued writes: a cell's output stopped at 64 KiB (not marked truncated)
// and its tail came out as the next cell's.
func TestCodeContextJSBigOutput(t *testing.T) {
	testenv.RequireCommand(t, "node")
	a := startAgent(t)
	js := newContext(t, a, LangJavaScript)
	// short describes s without printing all of it.
	short := func(s string) string {
		if len(s) <= 40 {
			return fmt.Sprintf("%q", s)
		}
		return fmt.Sprintf("%d bytes: %q...%q", len(s), s[:20], s[len(s)-20:])
	}

	r := runCell(t, a, js, `process.stdout.write("B".repeat(70000)); process.stdout.write("END1\n"); process.stderr.write("e".repeat(90000) + "END2\n"); 1`, 0)
	require.Nil(t, r.Error)
	assert.Equal(t, short(strings.Repeat("B", 70000)+"END1\n"), short(r.Stdout))
	assert.Equal(t, short(strings.Repeat("e", 90000)+"END2\n"), short(r.Stderr))
	assert.False(t, r.Truncated)
	r = runCell(t, a, js, "2", 0)
	assert.Equal(t, `""`, short(r.Stdout), "the last cell's output does not spill into this one")
	assert.Equal(t, `""`, short(r.Stderr))
	assert.Equal(t, "2", *r.Value)

	// Past MaxOutput: cut, and said to be.
	r = runReq(t, a, js, CodeRunRequest{Code: `process.stdout.write("A".repeat(3e5)); console.log("cell2 output")`, MaxOutput: 100000})
	assert.True(t, r.Truncated)
	assert.Equal(t, short(strings.Repeat("A", 100000)), short(r.Stdout))
	r = runCell(t, a, js, `console.log("cell3 output")`, 0)
	assert.Equal(t, short("cell3 output\n"), short(r.Stdout))
	assert.False(t, r.Truncated)

	// A corked stream is flushed, not waited for in vain.
	r = runCell(t, a, js, `process.stdout.cork(); process.stdout.write("corked\n"); 5`, 0)
	require.NotNil(t, r.Value)
	assert.Equal(t, "5", *r.Value)
	assert.Equal(t, "corked\n", r.Stdout)

	// A cell that ends its streams still gets its answer.
	r = runCell(t, a, js, `console.log("bye"); process.stdout.end(); process.stderr.destroy(); 3`, 0)
	require.Nil(t, r.Error)
	require.NotNil(t, r.Value)
	assert.Equal(t, "3", *r.Value)
	assert.Equal(t, "bye\n", r.Stdout)
	r = runCell(t, a, js, "4", 0)
	require.NotNil(t, r.Value)
	assert.Equal(t, "4", *r.Value)
	assert.Empty(t, r.Ended)
}
